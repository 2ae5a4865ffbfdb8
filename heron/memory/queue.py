"""The review queue: suggestions wait in the store until the user keeps or drops them.

A suggestion the person rejected stays rejected: a pass picking the same thing again (the same
statement of theirs, the same lesson, the same removal or rewrite of an unchanged entry) is
refused with `TurnedDown`, so the next fold or night does not ask again. Only the person brings
a rejected fact back, by saying it again (a statement made after the rejection is a new one)."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Literal

from heron.memory import records
from heron.memory.entries import MemoryRefused
from heron.memory.guard import quote_key
from heron.store import Store

SuggestionKind = Literal["fact", "lesson", "removal", "amendment"]
Status = Literal["waiting", "accepted", "rejected", "dropped"]


@dataclass(frozen=True)
class Suggestion:
    id: int
    kind: SuggestionKind
    path: str | None
    text: str | None
    quote: str | None
    mistake: str | None
    reason: str | None
    origin: str
    conversation_id: int | None
    message_id: int | None
    base_digest: str | None
    status: Status
    created: float
    decided: float | None = None

    def describe(self) -> str:
        """One line for a checklist or a listing."""
        if self.kind == "removal":
            what = f"remove {self.path}" + (f" ({self.reason})" if self.reason else "")
        elif self.kind == "amendment":  # the text it replaces is in `reason`: the diff
            was = f' from "{" ".join(self.reason.split())}"' if self.reason else ""
            what = f'change {self.path}{was} to "{self.text}"'

        elif self.kind == "lesson":
            what = f"lesson for {self.path}: {self.text}"
            if self.mistake:
                what += f" (prevents: {self.mistake})"
        else:
            what = f"{self.path}: {self.text}"
        if self.quote:
            what += f' [you said: "{self.quote}"]'
        return what


def add(
    store: Store,
    kind: SuggestionKind,
    *,
    origin: str,
    path: str | None = None,
    text: str | None = None,
    quote: str | None = None,
    mistake: str | None = None,
    reason: str | None = None,
    conversation_id: int | None = None,
    message_id: int | None = None,
    base_digest: str | None = None,
    said: float | None = None,
) -> int:
    """Queue a suggestion; one already waiting with the same kind, path, text and quote (the
    compaction pass and a later review pass can both pick the same fact) is not queued twice:
    its id is returned instead. `said`: when the person said the quote (its newest message).
    Raises TurnedDown when the person rejected the same suggestion before."""
    refused = turned_down(store, kind, path, text, quote, base_digest, said)
    if refused is not None:
        raise TurnedDown(
            f"refused: the user turned this down before (suggestion #{refused.id}); it is not "
            "proposed again",
            hint="Only the user brings it back: by saying it again, or saving it themselves.",
        )
    values = {
        "kind": kind,
        "path": path,
        "text": text,
        "quote": quote,
        "mistake": mistake,
        "reason": reason,
        "origin": origin,
        "conversation_id": conversation_id,
        "message_id": message_id,
        "base_digest": base_digest,
        "created": time.time(),
    }
    return records.queue_suggestion(store, values)


class TurnedDown(MemoryRefused):
    """The person rejected this suggestion before."""


def _key(
    kind: str, path: str | None, text: str | None, quote: str | None, digest: str | None
) -> tuple[str | None, ...]:
    """What a rejection is of: the person's statement (a fact, or an amendment in their words,
    wherever a pass would file it), a lesson's rule, or a removal or rewrite of an entry as it
    was (a changed entry may be proposed again)."""
    if kind in ("fact", "amendment") and quote:
        return ("said", quote_key(quote))
    if kind == "lesson":
        return ("lesson", quote_key(text or ""))
    return (kind, path, digest, quote_key(text or ""))


def turned_down(
    store: Store,
    kind: str,
    path: str | None,
    text: str | None,
    quote: str | None,
    digest: str | None,
    said: float | None = None,
) -> Suggestion | None:
    """The rejected suggestion this one repeats, if any (case, spacing, quotes and the
    punctuation around them folded: memory's quote_key). A statement the person made again
    after the rejection (`said` later than it) is a new one."""
    key = _key(kind, path, text, quote, digest)
    for s in (_row(r) for r in records.rejected_suggestions(store)):
        if _key(s.kind, s.path, s.text, s.quote, s.base_digest) != key:
            continue
        if key[0] == "said" and said is not None and said > (s.decided or 0.0):
            continue
        return s
    return None


def get(store: Store, suggestion_id: int) -> Suggestion | None:
    row = records.suggestion(store, suggestion_id)
    return _row(row) if row is not None else None


def waiting(store: Store) -> list[Suggestion]:
    return [_row(r) for r in records.waiting_suggestions(store)]


def count_waiting(store: Store) -> int:
    return records.count_waiting(store)


def decide(store: Store, suggestion_id: int, status: Status) -> None:
    records.set_status(store, suggestion_id, status, time.time())


def _row(r: sqlite3.Row) -> Suggestion:
    return Suggestion(
        r["id"],
        r["kind"],
        r["path"],
        r["text"],
        r["quote"],
        r["mistake"],
        r["reason"],
        r["origin"],
        r["conversation_id"],
        r["message_id"],
        r["base_digest"],
        r["status"],
        r["created"],
        r["decided"],
    )
