"""Model profiles: what the loop budgets from, chosen by model name, overridden in config; and
the `ModelChoice` a run opens its provider from (config.py resolves it).

Quirks are data here, not branches in the adapters.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from heron.errors import ConfigError
from heron.providers.gguf import GgufFacts, fitting_window

ToolMode = Literal["native", "fenced"]
ProviderKind = Literal["anthropic", "openai", "local", "scripted"]


@dataclass(frozen=True)
class ModelProfile:
    context_window: int = 128_000
    max_output: int = 8_192
    tool_mode: ToolMode = "native"
    # Reasoning content must go back to the server for tool-call continuity (DeepSeek-style).
    resend_reasoning: bool = False
    # A reply cut by the output cap is continued (up to [agent] max_continuations); a tiny model
    # only loops on when asked to go on, so its profile turns this off.
    continue_cut: bool = True
    # The repetition guard (heron/providers/repetition.py): a reply that starts looping is
    # stopped while it streams. On for small local models, which fall into loops.
    loop_guard: bool = False
    # A system prompt of a few lines instead of the full one (heron/context/prompt.py), for a
    # model whose window and attention a full prompt would swamp.
    brief_prompt: bool = False
    # Sampling defaults of the in-process llama.cpp server (heron/providers/local.py); None
    # keeps llama.cpp's own. Remote servers get none of these: their defaults stand.
    temperature: float | None = None
    repeat_penalty: float | None = None
    # Whether the model takes images and PDFs as attachments (heron/attachments.py); one that
    # does not gets a short note in their place (heron/providers/wire.py `file_note`). Off by
    # default: an unknown local model is assumed to read text only.
    vision: bool = False
    pdf: bool = False
    # Whether the model is offered tools at all. A local GGUF whose chat template never names
    # tools has none (heron/providers/gguf.py): offered them anyway, it talks about them
    # instead of answering. (The tools any model gets: heron/agent/engine.py opening_registry.)
    tools: bool = True


# A tiny model (SmolLM2-135M, or any GGUF file under TINY_PARAMETERS): a short cap, no
# continuation, the guard, a brief prompt, low temperature and a mild repeat penalty. Measured
# on SmolLM2-135M over 21 short prompts x 3 seeds (docs/engine.md): at temperature 0.2 without a
# penalty the guard stopped 8 loops, with 1.1 none, and "What is the capital of France?" still
# answers Paris (5 seeds of 5).
TINY = ModelProfile(
    8_192,
    512,
    tool_mode="fenced",
    continue_cut=False,
    loop_guard=True,
    brief_prompt=True,
    temperature=0.2,
    repeat_penalty=1.1,
)
# First match wins; patterns are fnmatch globs over the lower-cased model name.
_BUILTIN: list[tuple[str, ModelProfile]] = [
    ("claude-*opus*", ModelProfile(200_000, 32_000, vision=True, pdf=True)),
    ("claude-*", ModelProfile(200_000, 16_000, vision=True, pdf=True)),
    ("gpt-4o*", ModelProfile(128_000, 16_384, vision=True, pdf=True)),
    ("gpt-4.1*", ModelProfile(1_000_000, 32_768, vision=True, pdf=True)),
    ("gpt-5*", ModelProfile(400_000, 64_000, vision=True, pdf=True)),
    ("o[134]*", ModelProfile(200_000, 64_000)),
    ("deepseek-reasoner*", ModelProfile(128_000, 32_000, resend_reasoning=True)),
    ("deepseek*", ModelProfile(128_000, 8_192)),
    ("*smollm*", TINY),
    ("*qwen*", ModelProfile(32_768, 8_192)),
    # Llama 3.1, 3.2 and 3.3 (ollama's llama3.2, or meta-llama/Llama-3.3-70B-Instruct) have a
    # 128k window and call tools natively; older Llamas fall to the cautious profile below.
    ("*llama3.[123]*", ModelProfile(131_072, 8_192)),
    ("*llama-3.[123]*", ModelProfile(131_072, 8_192)),
    ("*llama*", ModelProfile(8_192, 2_048, tool_mode="fenced")),
]


def attachments_taken(profile: ModelProfile) -> str:
    """Which attached files a model gets as themselves (the rest of them as a note)."""
    taken = [kind for kind, on in (("images", profile.vision), ("PDFs", profile.pdf)) if on]
    return ", ".join(taken) if taken else "text only"


def tool_calls(profile: ModelProfile) -> str:
    """How the model calls tools, as tables say it: native, fenced, or none offered."""
    return profile.tool_mode if profile.tools else "none"


def markdown_table() -> str:
    """The README's "Models Heron knows" table, from the profiles above (a test checks that
    the README holds exactly this)."""
    lines = ["| model name (glob) | context window | output cap | tool calls | attachments |"]
    lines.append("| --- | ---: | ---: | --- | --- |")
    for pattern, p in _BUILTIN:
        lines.append(
            f"| `{pattern}` | {p.context_window:,} | {p.max_output:,} | {tool_calls(p)} "
            f"| {attachments_taken(p)} |"
        )
    return "\n".join(lines)


_FIELDS: dict[str, type] = {
    "context_window": int,
    "max_output": int,
    "tool_mode": str,
    "resend_reasoning": bool,
    "continue_cut": bool,
    "loop_guard": bool,
    "brief_prompt": bool,
    "temperature": float,
    "repeat_penalty": float,
    "vision": bool,
    "pdf": bool,
    "tools": bool,
}


def profile_for(
    model: str, overrides: Mapping[str, Mapping[str, object]] | None = None
) -> ModelProfile:
    """The built-in profile for `model`, then any `[models."<glob>"]` overrides from config."""
    name = model.lower()
    profile = next((p for pat, p in _BUILTIN if fnmatch.fnmatch(name, pat)), ModelProfile())
    return overridden(profile, model, overrides)


def known_name(model: str) -> bool:
    """Whether a built-in profile names `model` (any other name gets the default one)."""
    return any(fnmatch.fnmatch(model.lower(), pattern) for pattern, _ in _BUILTIN)


# Below this many parameters a GGUF model gets the tiny profile: SmolLM2's 135M and 360M loop
# and take a full system prompt for the question; 1B-class models answer with the full prompt.
TINY_PARAMETERS = 1_000_000_000
# The window of a GGUF file that names no trained context length (llama.cpp's own default).
UNSAID_WINDOW = 4_096


def gguf_profile(
    facts: GgufFacts,
    model: str,
    overrides: Mapping[str, Mapping[str, object]] | None = None,
    memory: int | None = None,
) -> ModelProfile:
    """The profile of a local GGUF model, from what its file says rather than its name: the
    window it was trained on, as far as its cache fits a share of the machine's `memory`
    (`fitting_window`), tools only when its chat template takes them (else none, with past
    tool calls rendered as text), the tiny profile under TINY_PARAMETERS; then the
    `[models."<glob>"]` overrides. choose_model caps the window at the trained length."""
    window = facts.context_length or UNSAID_WINDOW
    fits = fitting_window(facts, memory)
    if fits is not None:
        window = min(window, fits)
    tools = facts.takes_tools
    tiny = facts.parameters is not None and facts.parameters < TINY_PARAMETERS
    base = TINY if tiny else ModelProfile(max_output=8_192)
    mode: ToolMode = "native" if tools else "fenced"
    profile = replace(base, context_window=window, tools=tools, tool_mode=mode)
    return overridden(profile, model, overrides)


def overridden(
    profile: ModelProfile, model: str, overrides: Mapping[str, Mapping[str, object]] | None
) -> ModelProfile:
    """`profile` with the `[models."<glob>"]` tables that match `model` applied, in order."""
    name = model.lower()
    for pattern, values in (overrides or {}).items():
        if fnmatch.fnmatch(name, pattern.lower()):
            profile = apply_overrides(profile, values, where=f'[models."{pattern}"]')
    return profile


def apply_overrides(
    profile: ModelProfile, values: Mapping[str, object], *, where: str
) -> ModelProfile:
    # Each value's type is checked against _FIELDS below, per key: beyond what mypy can follow.
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in _FIELDS:
            known = ", ".join(_FIELDS)
            raise ConfigError(f"{where}: unknown key {key!r}", hint=f"Known keys: {known}.")
        expected = _FIELDS[key]
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # TOML writes 1 for 1.0
        if not isinstance(value, expected) or isinstance(value, bool) != (expected is bool):
            raise ConfigError(f"{where}: {key} must be {expected.__name__}, got {value!r}")
        if key == "tool_mode" and value not in ("native", "fenced"):
            raise ConfigError(f"{where}: tool_mode must be 'native' or 'fenced', got {value!r}")
        changes[key] = value
    return replace(profile, **changes)


# The key sent to an OpenAI-compatible server when none is set: the SDK needs one, and a local
# server (ollama, llama.cpp, vLLM without --api-key) accepts any bearer token.
PLACEHOLDER_KEY = "not-needed"


@dataclass(frozen=True)
class ModelChoice:
    """Which wire a run uses, with which model, where, and with which key."""

    provider: ProviderKind
    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)  # never in a log line or a traceback
    model_path: Path | None = None  # for the local provider
    profile: ModelProfile = ModelProfile()
    embedded: bool = False  # the tiny offline default (the chat shows a banner)
    # The setting that named base_url ("HERON_BASE_URL", "[providers.openai] base_url in
    # config.toml"): errors about the server say what to fix. None: the provider's own API.
    url_source: str | None = None
    # What the local model's GGUF file says (its profile was made from it); None otherwise.
    facts: GgufFacts | None = None


def _size(parameters: int) -> str:
    if parameters >= 1_000_000_000:
        return f"{parameters / 1e9:.1f}B"
    return f"{parameters / 1e6:.0f}M"


def _cache(facts: GgufFacts, window: int) -> str:
    """What the window's cache takes, when the header gives the model's shape."""
    if facts.kv_bytes_per_token is None:
        return ""
    size = facts.kv_bytes_per_token * window
    return f" (cache {size / 1e9:.1f} GB)" if size >= 1e9 else f" (cache {size / 1e6:.0f} MB)"


def file_summary(choice: ModelChoice) -> str | None:
    """What was read from the local model's GGUF file and the profile made from it, in one
    line (`heron models`, /status, the chat's header); None for a model not run from a file."""
    facts = choice.facts
    if facts is None:
        return None
    p = choice.profile
    about = [facts.name or (choice.model_path.name if choice.model_path else choice.model)]
    if facts.parameters:
        about.append(f"{facts.size_label or _size(facts.parameters)} parameters")
    trained = f"{facts.context_length:,} tokens" if facts.context_length else "not said"
    about.append(f"trained context {trained}")
    if p.tools:
        tools = "yes" if p.tool_mode == "native" else "yes, as fenced text"
    else:
        why = "its chat template takes none" if not facts.takes_tools else "configured off"
        tools = f"no ({why})"
    said = f"window {p.context_window:,}{_cache(facts, p.context_window)}, "
    said += f"output cap {p.max_output:,}, tools {tools}"
    if p.brief_prompt:
        said += ", brief prompt"
    if p.loop_guard:
        said += ", loop guard"
    return f"from the file: {', '.join(about)}; {said}"
