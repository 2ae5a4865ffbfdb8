"""A prompt longer than the model's window, as each server says it, and the window it states.

Both wires map an HTTP 400 or 413 through here. Servers word it differently, and most state
their window, which the turn then compacts to (heron/agent/turn.py) instead of guessing:

- OpenAI, vLLM, OpenRouter: "This model's maximum context length is 9000 tokens. ...",
  code `context_length_exceeded`;
- llama.cpp's server: "request (4476 tokens) exceeds the available context size (4096
  tokens), ...", type `exceed_context_size_error`, with `n_ctx` in the error object;
- ollama: "the input length exceeds the context length" (no number);
- Anthropic: "prompt is too long: 208310 tokens > 200000 maximum".
"""

from __future__ import annotations

import re

from heron.errors import ContextOverflow

# Lower-cased, anywhere in the error's code, type, message or body.
MARKERS = (
    "context_length_exceeded",
    "exceed_context_size_error",
    "maximum context length",
    "context length",
    "context size",
    "context window",
    "exceeds the context",
    "prompt is too long",
    "input is too long",
)

_NUMBER = r"(\d[\d,]*)"
# The window a server states, in the wordings above.
_LIMITS = (
    re.compile(r"maximum context length is " + _NUMBER, re.I),
    re.compile(r"available context size \(" + _NUMBER + r" tokens?\)", re.I),
    re.compile(r'"n_ctx"\s*:\s*' + _NUMBER),
    re.compile(r"tokens? > " + _NUMBER + r" maximum", re.I),
    re.compile(r"context (?:length|size|window) (?:is|of) " + _NUMBER + r" tokens", re.I),
)


def is_overflow(status: int, text: str) -> bool:
    """Whether an HTTP error says the prompt is over the window (`text`: code, type, body).
    A 500 counts too: llama.cpp's server said so with a 500 before it had its own type."""
    lowered = text.lower()
    return status in (400, 413, 500) and any(marker in lowered for marker in MARKERS)


def stated_limit(text: str) -> int | None:
    """The window in tokens the error states, or None when it states none."""
    for pattern in _LIMITS:
        found = pattern.search(text)
        if found is not None:
            tokens = int(found.group(1).replace(",", ""))
            if tokens > 0:
                return tokens
    return None


def overflow_error(message: str, model: str, text: str, status: int, body: str) -> ContextOverflow:
    """The error for an overflow, with the window the server stated and the setting that tells
    Heron that window, should compacting to it not be enough."""
    limit = stated_limit(text)
    return ContextOverflow(
        message, limit=limit, status=status, body=body, hint=window_hint(model, limit)
    )


def window_setting(model: str) -> str:
    """Where config.toml gives a model its window."""
    return f'context_window under [models."{model or "<model>"}"] in config.toml'


def window_hint(model: str, limit: int | None) -> str:
    """Which setting to change: a model's window in config.toml, or HERON_CONTEXT_WINDOW."""
    setting = window_setting(model)
    if limit is None:
        return (
            "The server refused the prompt as longer than the model's window: set "
            f"{setting} to the window the server runs the model with (or HERON_CONTEXT_WINDOW "
            "for one run), so Heron compacts the conversation to fit it."
        )
    return (
        f"The server says the window of {model} is {limit:,} tokens: set {setting} to "
        f"{limit} (or HERON_CONTEXT_WINDOW={limit} for one run), so Heron compacts the "
        "conversation to fit it."
    )
