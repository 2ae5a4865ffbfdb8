"""The first place two request payloads differ, said in the words of a conversation: which
message, which part, which field, and where in the text."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TypeAlias

_MISSING = object()
_PART_LISTS = ("parts", "content", "tool_calls")
Step: TypeAlias = str | int  # a key of an object or an index into a list


@dataclass(frozen=True)
class Difference:
    path: tuple[Step, ...]  # JSON path into the payload
    recorded: object
    now: object
    where: str  # e.g. "message 3 (user), part 1 (tool_result), field content"

    def describe(self) -> str:
        return f"{self.where}: {_excerpt(self.recorded, self.now)}"


def first_difference(recorded: object, now: object) -> Difference | None:
    """None when equal; else the first differing path (dict keys in sorted order, the order the
    canonical JSON is written in)."""
    path = _walk(recorded, now, ())
    if path is None:
        return None
    return Difference(path, _at(recorded, path), _at(now, path), describe_path(recorded, path))


def _walk(a: object, b: object, path: tuple[Step, ...]) -> tuple[Step, ...] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return (*path, key)
            found = _walk(a[key], b[key], (*path, key))
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            if i >= len(a) or i >= len(b):
                return (*path, i)
            found = _walk(a[i], b[i], (*path, i))
            if found is not None:
                return found
        return None
    if isinstance(a, str) and isinstance(b, str) and a != b and _redacted_alike(a, b):
        return None
    return None if a == b and type(a) is type(b) else path


# What the trace keeps of a secret it was given (heron/redact.py): `[redacted: kind]`.
_REDACTED = re.compile(r"\[redacted(?:: [^\]]+)?\]")


def _redacted_alike(recorded: str, now: str) -> bool:
    """Whether `now` is `recorded` with each of its redactions standing for a secret (four
    characters or more): the trace keeps a key the person typed as `[redacted: ...]`, the
    conversation keeps it whole, and the request made again holds it (qa24g M1: replay said an
    unchanged run differed, and printed the key)."""
    if "[redacted" not in recorded:
        return False
    pieces = _REDACTED.split(recorded)
    if len(pieces) == 1:
        return False
    pattern = ".{4,}?".join(re.escape(piece) for piece in pieces)
    return re.fullmatch(pattern, now, re.DOTALL) is not None


def _at(value: object, path: tuple[Step, ...]) -> object:
    for step in path:
        if isinstance(value, dict):
            if step not in value:
                return _MISSING
            value = value[step]
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            return _MISSING
    return value


def describe_path(payload: object, path: tuple[Step, ...]) -> str:
    """Name a JSON path like a person would: message 3 (user), part 1 (text), field text."""
    words: list[str] = []
    node = payload
    i = 0
    while i < len(path):
        step = path[i]
        child = _at(node, (step,))
        if step == "messages" and i + 1 < len(path):
            index = path[i + 1]
            message = _at(node, ("messages", index))
            role = message.get("role", "?") if isinstance(message, dict) else "missing"
            words.append(f"message {index} ({role})")
            node, i = message, i + 2
            continue
        if step in _PART_LISTS and isinstance(child, list) and i + 1 < len(path):
            index = path[i + 1]
            part = _at(child, (index,))
            words.append(f"part {index} ({_part_kind(part)})")
            node, i = part, i + 2
            continue
        if step == "tools" and isinstance(child, list) and i + 1 < len(path):
            tool = _at(child, (path[i + 1],))
            words.append(f"tool {path[i + 1]} ({_tool_name(tool)})")
            node, i = tool, i + 2
            continue
        if step == "system" and not words:
            words.append("the system prompt")
        else:
            words.append(f"field {step}" if isinstance(step, str) else f"item {step}")
        node, i = child, i + 1
    return ", ".join(words) or "the payload"


def _part_kind(part: object) -> str:
    if not isinstance(part, dict):
        return "missing" if part is _MISSING else type(part).__name__
    return str(part.get("kind") or part.get("type") or "?")


def _tool_name(tool: object) -> str:
    if not isinstance(tool, dict):
        return "missing"
    return str(tool.get("name") or tool.get("function", {}).get("name") or "?")


def _excerpt(recorded: object, now: object, width: int = 40) -> str:
    if recorded is _MISSING:
        return f"not in the recorded request; the replay has {_short(now, width * 2)}"
    if now is _MISSING:
        return f"in the recorded request ({_short(recorded, width * 2)}), missing in the replay"
    if isinstance(recorded, str) and isinstance(now, str):
        at = next((k for k, (x, y) in enumerate(zip(recorded, now, strict=False)) if x != y), None)
        at = min(len(recorded), len(now)) if at is None else at
        lo = max(at - width, 0)
        return (
            f"text differs at character {at}: recorded {recorded[lo : at + width]!r}"
            f" vs now {now[lo : at + width]!r}"
        )
    return f"recorded {_short(recorded, width * 2)} vs now {_short(now, width * 2)}"


def _short(value: object, limit: int) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"
