"""The memory and recent-history sections of the system prompt, and freezing them.

Both sections are pure functions of their inputs, in a deterministic order, so the same memory
gives the same bytes. The memory section is frozen per conversation (in `memory_snapshots`)
until the next compaction or /new: an entry saved or edited meanwhile is announced once in the
runtime block instead, so the cached prefix of the conversation does not move. An entry removed
(forgotten, deleted by hand) thaws it: no request may carry it after that.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from heron import timefmt
from heron.memory import records
from heron.memory.entries import Entry
from heron.memory.refuse import find_secret
from heron.store import Store

MEMORY_INTRO = (
    "Entries the user keeps in memory: their own words, saved as files they can edit. Apply "
    "every entry that matches the task; several can apply at once. The path in brackets names "
    "the entry for view_memory and manage_memory."
)


ENTRY_CAP = 1_000  # characters of one entry shown whole (saves over it are refused)
ENTRY_HEAD = 300  # characters an entry over the cap shows


def over_cap(entry: Entry) -> bool:
    """An entry too long to show whole in the prompt (hand-written: saves are capped)."""
    return len(entry.text.strip()) > ENTRY_CAP


# A time told relative to the day it was said: "last month", "yesterday", "three weeks ago",
# "next Friday", "recently". An entry is the person's words as they said them, so such an entry
# shows the day they said it (the day it was saved when that is not known): months later, "last
# month" is still read from that day.
_UNITS = r"(?:days?|nights?|weeks?|weekends?|months?|years?|summers?|winters?|springs?|autumns?)"
_DAYS = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_COUNT = r"(?:\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a few|a couple of|several)"
_RELATIVE = re.compile(
    rf"\b(?:yesterday|today|tonight|tomorrow|recently|lately|the other day"
    rf"|(?:last|next|this|coming|past|previous) (?:{_UNITS}|{_DAYS}|fall|morning|evening)"
    rf"|{_COUNT} {_UNITS} (?:ago|from now|back)|in {_COUNT} {_UNITS})\b",
    re.IGNORECASE,
)


def relative_time(text: str) -> str | None:
    """The words of `text` that tell a time relative to when it was said, if any."""
    found = _RELATIVE.search(text)
    return found.group(0) if found else None


def day_shown(entry: Entry, zone: str) -> str | None:
    """ "said <day>", the day the person said the entry's words (a suggestion kept from the
    review queue is saved days or weeks after), or "saved <day>" for an entry that does not
    know it (written by hand, or before `said` was kept); None when neither is known."""
    verb, when = ("said", entry.source.said) if entry.source.said else ("saved", entry.created)
    return f"{verb} {timefmt.when(when, zone, timefmt.DAY)}" if when else None


def _where(entry: Entry, zone: str) -> str:
    """The entry's path, and, when its words tell a relative time, the day they are read from."""
    day = day_shown(entry, zone)
    if day is None or relative_time(entry.text) is None:
        return entry.path.rel
    return f"{entry.path.rel}, {day}"


def _item(entry: Entry, tag: str = "", zone: str = "UTC") -> str:
    text = entry.text.strip()
    if len(text) > ENTRY_CAP:
        cut = text[:ENTRY_HEAD].rsplit(" ", 1)[0] if " " in text[:ENTRY_HEAD] else text[:ENTRY_HEAD]
        text = (
            f"{cut}… [an entry of {len(text):,} characters, more than the {ENTRY_CAP:,} shown"
            f' here: view_memory("{entry.path.rel}") reads it whole]'
        )
    lines = text.splitlines() or [""]
    head = f"- {tag}{lines[0]} ({_where(entry, zone)})"
    return "\n".join([head, *(f"  {line}" if line else "" for line in lines[1:])])


def _title(entry: Entry, tag: str = "", zone: str = "UTC") -> str:
    first = " ".join(entry.text.split())
    return f"- {tag}{first[:60]}{'…' if len(first) > 60 else ''} ({_where(entry, zone)})"


def _fill(items: Sequence[tuple[Entry, str]], budget: int, zone: str) -> tuple[list[str], int, int]:
    """(lines, tokens left, entries left out): whole while `budget` lasts, then by title
    while it still lasts, then left out (view_memory lists every one)."""
    lines: list[str] = []
    titles = False
    for n, (entry, tag) in enumerate(items):
        line = _title(entry, tag, zone) if titles else _item(entry, tag, zone)
        if not titles and _tokens(line) > budget:
            titles, line = True, _title(entry, tag, zone)
        if _tokens(line) > budget:
            return lines, budget, len(items) - n
        lines.append(line)
        budget -= _tokens(line)
    return lines, budget, 0


def memory_section(entries: Sequence[Entry], tokens: int | None = None, zone: str = "UTC") -> str:
    """Every always/ entry under Preferences, every when/ entry under Situational preferences
    tagged with its topic; an entry over ENTRY_CAP by its head and a pointer to view_memory.
    With `tokens`, past that budget the entries are listed by title (when/ first go to
    titles: always/ entries apply everywhere). An entry that tells a relative time ("last
    month") shows the day it was said (else saved), in the agent's `zone`. Empty memory gives
    an empty string."""
    always = sorted((e for e in entries if e.path.kind == "always"), key=lambda e: e.path)
    when = sorted(
        (e for e in entries if e.path.kind == "when"),
        key=lambda e: (e.path.topic or "", e.path.scope, e.path.slug),
    )
    if not always and not when:
        return ""
    budget = 10**12 if tokens is None else max(0, tokens - _tokens(MEMORY_INTRO) - 40)
    kept, budget, left = _fill([(e, "") for e in always], budget, zone)
    situational, _, left_when = _fill([(e, f"[when: {e.path.topic}] ") for e in when], budget, zone)
    parts = ["# Memory", MEMORY_INTRO]
    if kept:
        parts.append("## Preferences\n" + "\n".join(kept))
    if situational:
        parts.append("## Situational preferences\n" + "\n".join(situational))
    if left + left_when:
        parts.append(
            f"({left + left_when} more entries are not shown: view_memory lists every entry.)"
        )
    return "\n\n".join(parts)


# ---- freezing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrozenMemory:
    """What BUILD puts in the prompt: the frozen section, and a note for the runtime block
    (None when nothing changed since the last announcement)."""

    section: str
    note: str | None


def frozen_memory(
    store: Store,
    conversation_id: int,
    entries: Sequence[Entry],
    tokens: int | None = None,
    zone: str = "UTC",
) -> FrozenMemory:
    """The conversation's frozen section (taken now on first use, within `tokens`) and the
    changes since it that were not announced yet; the announcement is recorded so it is made
    once."""
    current = {e.path.rel: e for e in entries}
    row = records.snapshot(store, conversation_id)
    if row is None:
        return FrozenMemory(_freeze(store, conversation_id, entries, tokens, zone), None)
    seen = {**json.loads(row["digests"]), **json.loads(row["announced"])}
    lines, announced = _changes(seen, current, zone)
    if row["thawed"] or set(json.loads(row["digests"])) - set(current):
        # An entry of the section was removed (forgotten, deleted by hand): no request may
        # carry it from now on, so the section is written again, at the price of one cache
        # miss, as for an edit of a workspace file (qa22x H1). Told once, as any change.
        section = _freeze(store, conversation_id, entries, tokens, zone)
        note = "Memory changed: this conversation's Memory section was written again, " + (
            "without what was removed:\n" + "\n".join(lines) if lines else "as it is now."
        )
        return FrozenMemory(section, note)
    if not lines:
        return FrozenMemory(row["section"], None)
    merged = {**json.loads(row["announced"]), **announced}
    records.set_announced(store, conversation_id, json.dumps(merged, sort_keys=True))
    note = "Memory changed since this conversation's Memory section was written (this " + (
        "supersedes it):\n" + "\n".join(lines)
    )
    return FrozenMemory(row["section"], note)


def _freeze(
    store: Store, conversation_id: int, entries: Sequence[Entry], tokens: int | None, zone: str
) -> str:
    """The section for `entries`, frozen for the conversation from now on."""
    section = memory_section(entries, tokens, zone)
    frozen = json.dumps({e.path.rel: e.digest for e in entries}, sort_keys=True)
    records.save_snapshot(store, conversation_id, section, frozen, time.time())
    return section


def _changes(
    seen: dict[str, str], current: dict[str, Entry], zone: str
) -> tuple[list[str], dict[str, str]]:
    """Lines describing what differs from what the model was last told; '' marks a removal."""
    lines: list[str] = []
    announced: dict[str, str] = {}
    for rel in sorted(set(seen) | set(current)):
        entry = current.get(rel)
        before = seen.get(rel, "")
        if entry is None:
            if before:
                lines.append(f"- removed: {rel} (no longer in force)")
                announced[rel] = ""
            continue
        if entry.digest != before:
            verb = "saved" if not before else "changed"
            tag = f"[when: {entry.path.topic}] " if entry.path.topic else ""
            if find_secret(entry.text):
                # The note is stored with the person's message and sent with every later
                # request of the conversation: a secret in it would outlive its forget
                # (qa22v H1). The path is enough for view_memory.
                lines.append(secret_item(verb, rel))
            else:
                lines.append(f"- {verb}: {_item(entry, tag, zone)[2:]}")
            announced[rel] = entry.digest
    return lines, announced


SECRET_NOT_SHOWN = "[its text holds a secret: not shown]"


def secret_item(verb: str, rel: str) -> str:
    """The note's line for an entry `rel` saved or changed whose text holds a secret."""
    return f"- {verb}: {SECRET_NOT_SHOWN} ({rel})"


def hide_secret_items(note: str, rel: str) -> str:
    """`note` (a runtime block) with the line of each change of `rel` it announced with its
    text ("- saved: <text> (rel)" and the text's further lines) as `secret_item` writes it:
    what a forget of a secret leaves of the notes already sent."""
    head = re.compile(rf"- (saved|changed): .*\({re.escape(rel)}(?:, (?:said|saved) [^)]*)?\)")
    out: list[str] = []
    lines = note.split("\n")
    i = 0
    while i < len(lines):
        found = head.fullmatch(lines[i])
        if found is None:
            out.append(lines[i])
            i += 1
            continue
        out.append(secret_item(found.group(1), rel))
        i += 1
        while i < len(lines) and _continues(lines, i):
            i += 1
    return "\n".join(out)


def _continues(lines: list[str], i: int) -> bool:
    """Whether line `i` is a further line of the item above it: indented (`_item`), or blank
    with an indented line after its blank run."""
    if lines[i].startswith("  "):
        return True
    j = i
    while j < len(lines) and not lines[j]:
        j += 1
    return j > i and j < len(lines) and lines[j].startswith("  ")


# ---- recent history --------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryEntry:
    """One line of what happened: a compaction summary, the archive /new wrote, a note."""

    created: float
    text: str
    memory_only: bool = False  # e.g. the archive of what /new cleared: never shown as history


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def recent_history_section(
    entries: Sequence[HistoryEntry],
    *,
    floor: float = 0.0,
    max_entries: int = 50,
    max_tokens: int = 8_000,
    estimate: Callable[[str], int] = _tokens,
    zone: str = "UTC",
    timezone_fmt: Callable[[float], str] | None = None,
) -> str:
    """Up to `max_entries` entries / `max_tokens` tokens written after `floor` (the later of the
    last consolidation and the floor /new wrote), newest kept first, shown oldest first, each
    dated in the agent's `zone` (or by `timezone_fmt`)."""
    fmt = timezone_fmt or (lambda ts: timefmt.when(ts, zone))
    shown = [e for e in entries if e.created > floor and not e.memory_only]
    shown.sort(key=lambda e: e.created)
    kept: list[str] = []
    budget = max_tokens
    for entry in reversed(shown[-max_entries:]):
        line = f"- [{fmt(entry.created)}] {' '.join(entry.text.split())}"
        cost = estimate(line)
        if cost > budget:
            break
        kept.append(line)
        budget -= cost
    if not kept:
        return ""
    return "# Recent History\n" + "\n".join(reversed(kept))


def history_floor(store: Store, conversation_id: int) -> float:
    return records.history_floor(store, conversation_id)


def set_history_floor(store: Store, conversation_id: int, when: float | None = None) -> None:
    """/new calls this: what came before is not brought back as recent history."""
    records.set_history_floor(store, conversation_id, time.time() if when is None else when)
