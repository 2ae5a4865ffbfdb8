"""The hard invariant of every request: its estimated input plus the output reserve fits the
model's window. A request that still does not fit after every reduction (compaction, snipping,
the per-part budgets) is not sent; the turn ends with `RequestTooLarge`, which names the part
that is too large and what to do about it.
"""

from __future__ import annotations

import itertools
import re

from heron.errors import ProviderError

_SECTION = re.compile(r"\n\n(?=# )")


class RequestTooLarge(ProviderError):
    """A request that cannot fit the window: it was never sent (the user's message is kept)."""


def split_sections(text: str) -> list[str]:
    """The system prompt cut before each top-level `# ` heading; `"".join` gives it back."""
    cuts = [m.start() for m in _SECTION.finditer(text)]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def section_name(section: str) -> str:
    """`# Memory` -> `memory`: the heading of a system prompt section, for messages."""
    first = section.lstrip("\n").split("\n", 1)[0]
    return first.lstrip("# ").strip().lower() if first.startswith("# ") else "identity"


_WHAT_TO_DO = {
    "memory": "Shorten the largest memory entries (`heron memory list` flags them) or move "
    "them to when/ topics.",
    "workspace files": "Shorten AGENTS.md, SOUL.md or USER.md in the workspace.",
    "tool schemas": "The tools' descriptions take the most room: a model this small may do"
    ' better with none (tools = false under [models."{model}"] in config.toml).',
    "messages": "Send /compact, or /new to start afresh (the transcript stays).",
}


def _alone(name: str, tokens: int, window: int, output: int) -> str:
    """Said when the largest part alone leaves no room in the window: no compaction of the
    conversation can help then, only a smaller part or a larger window."""
    if tokens + output <= window:
        return ""
    return (
        f"; its {tokens:,} tokens alone do not fit with the answer's reserve, so"
        " compacting the conversation cannot make the request fit"
    )


def too_large(
    parts: dict[str, int], window: int, output: int, model: str = "<name>"
) -> RequestTooLarge:
    """The error for a request of `parts` (name -> tokens) that does not fit `window` of
    `model` (the name its config.toml setting takes)."""
    total = sum(parts.values())
    largest = max(parts, key=lambda k: parts[k])
    listed = ", ".join(f"{k} {v:,}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
    message = (
        f"the request was not sent: about {total:,} tokens of input ({listed}) and {output:,}"
        f" reserved for the answer do not fit the model's window of {window:,} tokens;"
        f" the largest part is {largest}{_alone(largest, parts[largest], window, output)}."
    )
    todo = _WHAT_TO_DO.get(largest, f"Shorten the {largest} section of the system prompt.")
    hint = (
        f"{todo.replace('{model}', model)} Or use a model with a larger window (context_window"
        f' under [models."{model}"] in config.toml, or HERON_CONTEXT_WINDOW).'
    )
    return RequestTooLarge(message, hint=hint)
