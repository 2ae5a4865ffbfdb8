"""The texts of compaction: the transcript a summarizer reads, the prompts, the parsing of its
answer, the summary Heron renders around it, and the deterministic fallbacks.

The user's own words are never left to the model: Heron quotes what the user wrote from the
record, whatever the summarizer returned: the newest messages verbatim while their budget
lasts, the older ones as pointers (row id and first words) that recall_history opens whole.
The archive is history at decreasing resolution: a rolling summary of everything (level 2),
the summaries of the latest folded parts (level 1), and the recent turns whole in the view.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from heron.context.prompt import USER_WROTE
from heron.context.tokens import estimate_text
from heron.context.view import bounded_quotes, person_words, user_texts
from heron.messages import File, Message, Text, ToolCall, ToolResult, dumps
from heron.providers.wire import file_label
from heron.store.records import StoredMessage

RESULT_HEAD = 300  # characters of each tool result a transcript or fallback keeps

SUMMARY_SYSTEM = """\
You compact a conversation between a user and an assistant so the assistant can continue it.
Write three sections in Markdown, nothing else:
## Facts
What was established: decisions, results, names, paths, ids, numbers, preferences stated.
Merge the previous facts with the new transcript; drop what was superseded.
## Working state
What was ongoing, the open items, the last step taken, and the references (paths, ids, commands)
the next turns need. Update the previous working state; do not repeat finished items.
## This part
A few lines on the new part of the conversation alone: what was asked and what was done.
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
    """(row id, text) of everything the person wrote in `rows`, in order: their messages and
    their answers to ask_user. Heron's own user-role rows (goal nudges, reminders, subagent
    results: author 'heron') are not the person's words and are left to the summary."""
    out = []
    for i, text in person_words([row.message for row in rows]):
        row = rows[i]
        if row.author != "heron" and text.strip() and not _synthetic(text):
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
            elif isinstance(part, File):  # the summary keeps what was attached, by name
                who = "User" if m.role == "user" else "Assistant"
                lines.append(f"{who} attached: {file_label(part)}")
    return "\n".join(lines)


_SECTION = re.compile(r"^##\s*(facts|working state|this part)\s*$", re.I | re.M)


def sections(text: str) -> dict[str, str]:
    """The sections of a summarizer's answer by lowercase name; all of it is facts when
    unsectioned."""
    marks = list(_SECTION.finditer(text))
    if not marks:
        return {"facts": text.strip()}
    found: dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        found[m.group(1).lower()] = text[m.end() : end].strip()
    return found


def parse_summary(text: str) -> tuple[str, str]:
    """(facts, working state) from a summarizer's answer; all of it is facts when unsectioned."""
    found = sections(text)
    return found.get("facts", ""), found.get("working state", "")


# ---- the archive's budget ----------------------------------------------------------------------


@dataclass(frozen=True)
class ArchiveRoom:
    """Tokens for each part of the archived context; `words` is the user's verbatim words."""

    words: int
    pointers: int
    facts: int
    chunks: int
    working: int
    state: int


def archive_room(archive: int, words: int) -> ArchiveRoom:
    """The archive's `archive` tokens split: `words` for the user's verbatim messages, the
    rest for pointers, the rolling facts, the latest parts' summaries, working state, todos."""
    words = min(words, archive)
    rest = archive - words
    return ArchiveRoom(words, rest // 5, rest // 4, rest // 4, rest * 3 // 20, rest * 3 // 20)


def clip(text: str, tokens: int) -> str:
    """`text` cut to about `tokens` tokens (its head), saying so."""
    size = estimate_text(text)
    if size <= tokens:
        return text
    keep = max(0, len(text) * max(0, tokens - 12) // max(1, size))
    return text[:keep].rstrip() + "\n[… cut to fit the archive's budget; the record keeps it]"


Chunk = tuple[int, int, str]  # (first row id, last row id, summary of that part): level 1


def render_chunks(chunks: Sequence[Chunk], tokens: int) -> str:
    """The latest parts' summaries, newest first while `tokens` last; shown oldest first."""
    kept: list[str] = []
    for first, last, text in reversed(chunks):
        line = f"- [#{first}–#{last}] {' '.join(text.split())}"
        if estimate_text(line) > tokens:
            if not kept:  # the newest always shows, cut to the room
                kept.append(clip(line, tokens))
            break
        kept.append(line)
        tokens -= estimate_text(line)
    return "\n".join(reversed(kept))


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
    facts: str,
    working_state: str,
    quotes: Sequence[tuple[int, str]],
    state: str,
    room: ArchiveRoom | None = None,
    chunks: Sequence[Chunk] = (),
) -> str:
    """The archived context; with `room`, every part within its share of the archive."""
    if room is None:
        said = render_quotes(quotes)
        level1 = render_chunks(chunks, 10**9)
    else:
        facts, working_state = clip(facts, room.facts), clip(working_state, room.working)
        state, level1 = clip(state, room.state), render_chunks(chunks, room.chunks)
        said = bounded_quotes(quotes, room.words, room.pointers)
    parts = [
        "The earlier part of this conversation was compacted by Heron. The full record is kept.",
        "## Facts\n" + (facts.strip() or "(none recorded)"),
    ]
    if level1:
        parts.append("## The latest parts, summarized (by row ids)\n" + level1)
    parts.append(USER_WROTE + (said or "(nothing)"))
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


def digest(messages: Sequence[Message]) -> str:
    """A one-line summary of a part, written without the model (level 1 when the summarizer
    wrote none): how many messages, the calls made by name, the start of the first request."""
    from collections import Counter

    calls = Counter(c.name for m in messages for c in m.tool_calls)
    asked = next((t for m in messages for t in user_texts(m) if t.strip()), "")
    first = " ".join(asked.split()[:12])
    made = ", ".join(f"{name} x{n}" for name, n in sorted(calls.items())) or "no calls"
    return f"{len(messages)} messages; calls: {made}; it began with: {first}"


CHECKPOINT_HEAD = (
    "[Checkpoint of this turn's earlier steps, written when the context filled up. "
    "The steps themselves are kept in the record.]"
)
CHECKPOINT_QUOTES = "## The user's messages in this turn\n"


def checkpoint_body(text: str) -> str:
    """The body a `checkpoint_text` was made of: its head, the user's quoted messages and the
    work state taken off, so the next checkpoint of the turn builds on it without nesting them."""
    body = text.removeprefix(CHECKPOINT_HEAD).strip()
    for tail in ("\n\n" + CHECKPOINT_QUOTES, "\n\n## Work state\n", "\n\n## Todos\n"):
        body = body.split(tail)[0]
    return body.strip()


def checkpoint_text(
    body: str, quotes: Sequence[tuple[int, str]], state: str, words: int | None = None
) -> str:
    """The checkpoint of a turn; with `words`, the user's messages in it are quoted newest
    first within that many tokens, then as pointers."""
    parts = [
        CHECKPOINT_HEAD,
        body.strip() if words is None else clip(body.strip(), words * 2),
    ]
    if quotes:
        said = render_quotes(quotes) if words is None else bounded_quotes(quotes, words, words)
        parts.append(CHECKPOINT_QUOTES + said)
    if state:
        parts.append(state)
    return "\n\n".join(parts)
