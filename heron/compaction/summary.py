"""The texts of compaction: the transcript a summarizer reads, the prompts, the parsing of its
answer, the summary Heron renders around it, and the deterministic fallbacks.

The user's own words are never left to the model: Heron quotes every message the user wrote,
verbatim, from the record, whatever the summarizer returned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from heron.context.view import user_texts
from heron.messages import Message, Text, ToolCall, ToolResult, dumps
from heron.store.records import StoredMessage

RESULT_HEAD = 300  # characters of each tool result a transcript or fallback keeps

SUMMARY_SYSTEM = """\
You compact a conversation between a user and an assistant so the assistant can continue it.
Write two sections in Markdown, nothing else:
## Facts
What was established: decisions, results, names, paths, ids, numbers, preferences stated.
Merge the previous facts with the new transcript; drop what was superseded.
## Working state
What was ongoing, the open items, the last step taken, and the references (paths, ids, commands)
the next turns need. Update the previous working state; do not repeat finished items.
Do not quote the user's messages: they are kept verbatim separately."""

CHECKPOINT_INSTRUCTION = """\
[Heron: this turn is filling the context window. Do not call a tool now. Write a checkpoint of
the turn so far, in Markdown, with exactly these sections:
## Request
## User's instructions (quoted)
## Done (with concrete paths, ids and values)
## Errors and dead ends
## Open items
## Current step
The steps before the last ones will be replaced by this checkpoint.]"""


# What the runner itself writes in the user's role (continue, wrap-up): not the user's words.
_SYNTHETIC = ("Your reply was cut off by the output limit.", "This run has reached its limit of")


def _synthetic(text: str) -> bool:
    return text.startswith(_SYNTHETIC)


def quotes_of(rows: Sequence[StoredMessage]) -> list[tuple[int, str]]:
    """(row id, text) of everything the user wrote in `rows`, in order."""
    out = []
    for row in rows:
        for text in user_texts(row.message):
            if text.strip() and not _synthetic(text):
                out.append((row.id, text))
    return out


def render_quotes(quotes: Sequence[tuple[int, str]]) -> str:
    return "\n".join(f"[#{rid}] {text}" for rid, text in quotes)


def _call_line(call: ToolCall) -> str:
    args = dumps(call.args)
    return f"{call.name}({args[:200]}{'…' if len(args) > 200 else ''})"


def transcript(messages: Sequence[Message], head: int = RESULT_HEAD) -> str:
    """A plain-text rendering of messages for a summarizer (results cut to their head)."""
    lines = []
    for m in messages:
        for part in m.parts:
            if isinstance(part, Text) and part.text.strip():
                who = "User" if m.role == "user" else "Assistant"
                lines.append(f"{who}: {part.text.strip()}")
            elif isinstance(part, ToolCall):
                lines.append(f"Call: {_call_line(part)}")
            elif isinstance(part, ToolResult):
                text = part.content[:head] + ("…" if len(part.content) > head else "")
                lines.append(f"Result{' (error)' if part.is_error else ''}: {text}")
    return "\n".join(lines)


_SECTION = re.compile(r"^##\s*(facts|working state)\s*$", re.I | re.M)


def parse_summary(text: str) -> tuple[str, str]:
    """(facts, working state) from a summarizer's answer; all of it is facts when unsectioned."""
    marks = list(_SECTION.finditer(text))
    if not marks:
        return text.strip(), ""
    found: dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        found[m.group(1).lower()] = text[m.end() : end].strip()
    return found.get("facts", ""), found.get("working state", "")


def state_block(work_state: dict[str, Any], todos: Sequence[Any]) -> str:
    """The work state and todos, re-injected after a compaction so they survive it."""
    parts = []
    if work_state:
        parts.append("## Work state\n" + json.dumps(work_state, ensure_ascii=False, indent=1))
    if todos:
        lines = [
            f"- [{t.status}] ({t.priority}) #{t.id} {t.text}"
            + (f" — verified by: {t.verified_by}" if t.verified_by else "")
            for t in todos
        ]
        parts.append("## Todos\n" + "\n".join(lines))
    return "\n\n".join(parts)


def render_summary(
    facts: str, working_state: str, quotes: Sequence[tuple[int, str]], state: str
) -> str:
    parts = [
        "The earlier part of this conversation was compacted by Heron. The full record is kept.",
        "## Facts\n" + (facts.strip() or "(none recorded)"),
        "## What the user wrote, verbatim (quoted by Heron from the record)\n"
        + (render_quotes(quotes) or "(nothing)"),
    ]
    if working_state.strip():
        parts.append("## Working state\n" + working_state.strip())
    if state:
        parts.append(state)
    return "\n\n".join(parts)


def fallback_facts(messages: Sequence[Message], previous: str = "") -> str:
    """Facts written without the model: the calls made and the start of each result."""
    calls = {c.id: c for m in messages for c in m.tool_calls}
    lines = [previous.strip()] if previous.strip() else []
    for m in messages:
        for r in m.tool_results:
            call = calls.get(r.call_id)
            name = _call_line(call) if call else r.call_id
            head = " ".join(r.content[:160].split())
            lines.append(f"- {name} -> {head}{'…' if len(r.content) > 160 else ''}")
    return "\n".join(lines) or "(no tool calls)"


def checkpoint_text(body: str, quotes: Sequence[tuple[int, str]], state: str) -> str:
    parts = [
        "[Checkpoint of this turn's earlier steps, written when the context filled up. "
        "The steps themselves are kept in the record.]",
        body.strip(),
    ]
    if quotes:
        parts.append("## The user's messages in this turn, verbatim\n" + render_quotes(quotes))
    if state:
        parts.append(state)
    return "\n\n".join(parts)
