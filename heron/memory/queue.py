"""The review queue: suggestions wait in the store until the user keeps or drops them."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Literal

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
    with store.transaction() as c:
        same = c.execute(
            "SELECT id FROM memory_suggestions WHERE status = 'waiting' AND kind = ?"
            " AND path IS ? AND text IS ? AND quote IS ?",
            (kind, path, text, quote),
        ).fetchone()
        if same is not None:
            return int(same[0])
        cur = c.execute(
            "INSERT INTO memory_suggestions (kind, path, text, quote, mistake, reason, origin,"
            " conversation_id, message_id, base_digest, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                kind,
                path,
                text,
                quote,
                mistake,
                reason,
                origin,
                conversation_id,
                message_id,
                base_digest,
                time.time(),
            ),
        )
    assert cur.lastrowid is not None
    return cur.lastrowid


def get(store: Store, suggestion_id: int) -> Suggestion | None:
    rows = store.query("SELECT * FROM memory_suggestions WHERE id = ?", (suggestion_id,))
    return _row(rows[0]) if rows else None


def waiting(store: Store) -> list[Suggestion]:
    rows = store.query("SELECT * FROM memory_suggestions WHERE status = 'waiting' ORDER BY id")
    return [_row(r) for r in rows]


def count_waiting(store: Store) -> int:
    rows = store.query("SELECT COUNT(*) FROM memory_suggestions WHERE status = 'waiting'")
    return int(rows[0][0])


def decide(store: Store, suggestion_id: int, status: Status) -> None:
    with store.transaction() as c:
        c.execute(
            "UPDATE memory_suggestions SET status = ?, decided = ? WHERE id = ?",
            (status, time.time(), suggestion_id),
        )


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
