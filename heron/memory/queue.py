"""The review queue: suggestions wait in the store until the user keeps or drops them."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Literal

from heron.memory import records
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
) -> int:
    """Queue a suggestion; one already waiting with the same kind, path, text and quote (the
    compaction pass and a later review pass can both pick the same fact) is not queued twice:
    its id is returned instead."""
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
    )
