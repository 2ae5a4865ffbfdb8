"""Model profiles: what the loop budgets from, chosen by model name, overridden in config.

Quirks are data here, not branches in the adapters.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from typing import Any, Literal

from heron.errors import ConfigError

ToolMode = Literal["native", "fenced"]


@dataclass(frozen=True)
class ModelProfile:
    context_window: int = 128_000
    max_output: int = 8_192
    tool_mode: ToolMode = "native"
    # Reasoning content must go back to the server for tool-call continuity (DeepSeek-style).
    resend_reasoning: bool = False


# First match wins; patterns are fnmatch globs over the lower-cased model name.
_BUILTIN: list[tuple[str, ModelProfile]] = [
    ("claude-*opus*", ModelProfile(200_000, 32_000)),
    ("claude-*", ModelProfile(200_000, 16_000)),
    ("gpt-4o*", ModelProfile(128_000, 16_384)),
    ("gpt-4.1*", ModelProfile(1_000_000, 32_768)),
    ("gpt-5*", ModelProfile(400_000, 64_000)),
    ("o[134]*", ModelProfile(200_000, 64_000)),
    ("deepseek-reasoner*", ModelProfile(128_000, 32_000, resend_reasoning=True)),
    ("deepseek*", ModelProfile(128_000, 8_192)),
    ("*smollm*", ModelProfile(8_192, 1_024, tool_mode="fenced")),
    ("*qwen*", ModelProfile(32_768, 8_192)),
    ("*llama*", ModelProfile(8_192, 2_048, tool_mode="fenced")),
]

_FIELDS = {"context_window": int, "max_output": int, "tool_mode": str, "resend_reasoning": bool}


def profile_for(model: str, overrides: dict[str, dict[str, Any]] | None = None) -> ModelProfile:
    """The built-in profile for `model`, then any `[models."<glob>"]` overrides from config."""
    name = model.lower()
    profile = next((p for pat, p in _BUILTIN if fnmatch.fnmatch(name, pat)), ModelProfile())
    for pattern, values in (overrides or {}).items():
        if fnmatch.fnmatch(name, pattern.lower()):
            profile = apply_overrides(profile, values, where=f'[models."{pattern}"]')
    return profile


def apply_overrides(profile: ModelProfile, values: dict[str, Any], *, where: str) -> ModelProfile:
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in _FIELDS:
            known = ", ".join(_FIELDS)
            raise ConfigError(f"{where}: unknown key {key!r}", hint=f"Known keys: {known}.")
        if not isinstance(value, _FIELDS[key]) or isinstance(value, bool) != (_FIELDS[key] is bool):
            raise ConfigError(f"{where}: {key} must be {_FIELDS[key].__name__}, got {value!r}")
        if key == "tool_mode" and value not in ("native", "fenced"):
            raise ConfigError(f"{where}: tool_mode must be 'native' or 'fenced', got {value!r}")
        changes[key] = value
    return replace(profile, **changes)
