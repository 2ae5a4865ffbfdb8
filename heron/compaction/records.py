"""The compaction tables (migration m003) read and written through a `Store`.

Functions are synchronous and short, like the store's own; the async side calls them through
`asyncio.to_thread`. Nothing here deletes or rewrites a message row.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from heron.context.tokens import Calibration
from heron.store import Store


@dataclass(frozen=True)
class Compaction:
    id: int
    conversation_id: int
    kind: str  # consolidation | fallback | inflight
    reason: str
    created: float
    first_row_id: int | None
    last_row_id: int | None
    anchor_row_id: int | None
    rows_folded: int
    tokens_before: int
    tokens_after: int
    summary: str
    working_state: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def is_consolidation(self) -> bool:
        return self.kind in ("consolidation", "fallback")


def _compaction(r: sqlite3.Row) -> Compaction:
    return Compaction(
        r["id"],
        r["conversation_id"],
        r["kind"],
        r["reason"],
        r["created"],
        r["first_row_id"],
        r["last_row_id"],
        r["anchor_row_id"],
        r["rows_folded"],
        r["tokens_before"],
        r["tokens_after"],
        r["summary"],
        r["working_state"],
        json.loads(r["meta"]) if r["meta"] else {},
    )


def compactions(store: Store, conversation_id: int) -> list[Compaction]:
    rows = store.query(
        "SELECT * FROM compactions WHERE conversation_id = ? ORDER BY id", (conversation_id,)
    )
    return [_compaction(r) for r in rows]


def marks(store: Store, conversation_id: int) -> dict[int, list[tuple[int, str]]]:
    """message id -> [(compaction id, mark)] for one conversation."""
    rows = store.query(
        "SELECT mm.message_id, mm.compaction_id, mm.mark FROM message_marks mm"
        " JOIN compactions c ON c.id = mm.compaction_id WHERE c.conversation_id = ?"
        " ORDER BY mm.compaction_id",
        (conversation_id,),
    )
    out: dict[int, list[tuple[int, str]]] = {}
    for r in rows:
        out.setdefault(r[0], []).append((r[1], r[2]))
    return out


def add_compaction(
    store: Store,
    conversation_id: int,
    *,
    kind: str,
    reason: str,
    summary: str,
    working_state: str = "",
    first_row_id: int | None = None,
    last_row_id: int | None = None,
    anchor_row_id: int | None = None,
    rows_folded: int = 0,
    tokens_before: int = 0,
    tokens_after: int = 0,
    compacted_rows: list[int] | None = None,
    meta: dict[str, Any] | None = None,
) -> int:
    """Record one compaction and its row marks in one transaction."""
    with store.transaction() as c:
        cur = c.execute(
            "INSERT INTO compactions (conversation_id, kind, reason, created, first_row_id,"
            " last_row_id, anchor_row_id, rows_folded, tokens_before, tokens_after, summary,"
            " working_state, meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conversation_id,
                kind,
                reason,
                time.time(),
                first_row_id,
                last_row_id,
                anchor_row_id,
                rows_folded,
                tokens_before,
                tokens_after,
                summary,
                working_state,
                json.dumps(meta) if meta else None,
            ),
        )
        cid = cur.lastrowid
        assert cid is not None
        for row_id in compacted_rows or []:
            c.execute("INSERT INTO message_marks VALUES (?, ?, 'compacted')", (row_id, cid))
        if anchor_row_id is not None:
            c.execute("INSERT INTO message_marks VALUES (?, ?, 'checkpoint')", (anchor_row_id, cid))
    return cid


# ---- failure counting and idle retry ---------------------------------------------------------


@dataclass(frozen=True)
class ContextState:
    failed_turns: int = 0
    last_failed_turn: int | None = None
    idle_retry_after: float = 0.0


def context_state(store: Store, conversation_id: int) -> ContextState:
    rows = store.query(
        "SELECT failed_turns, last_failed_turn, idle_retry_after FROM context_state"
        " WHERE conversation_id = ?",
        (conversation_id,),
    )
    return ContextState(rows[0][0], rows[0][1], rows[0][2]) if rows else ContextState()


def set_context_state(store: Store, conversation_id: int, state: ContextState) -> None:
    with store.transaction() as c:
        c.execute(
            "INSERT INTO context_state (conversation_id, failed_turns, last_failed_turn,"
            " idle_retry_after, updated) VALUES (?, ?, ?, ?, ?) ON CONFLICT(conversation_id)"
            " DO UPDATE SET failed_turns = excluded.failed_turns,"
            " last_failed_turn = excluded.last_failed_turn,"
            " idle_retry_after = excluded.idle_retry_after, updated = excluded.updated",
            (
                conversation_id,
                state.failed_turns,
                state.last_failed_turn,
                state.idle_retry_after,
                time.time(),
            ),
        )


# ---- calibration -----------------------------------------------------------------------------


def calibration(store: Store, model: str) -> tuple[Calibration, int]:
    rows = store.query(
        "SELECT factor, samples, last_call_id FROM model_calibration WHERE model = ?", (model,)
    )
    if not rows:
        return Calibration(), 0
    return Calibration(rows[0][0], rows[0][1]), rows[0][2]


def save_calibration(store: Store, model: str, cal: Calibration, last_call_id: int) -> None:
    with store.transaction() as c:
        c.execute(
            "INSERT INTO model_calibration (model, factor, samples, last_call_id, updated)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT(model) DO UPDATE SET factor = excluded.factor,"
            " samples = excluded.samples, last_call_id = excluded.last_call_id,"
            " updated = excluded.updated",
            (model, cal.factor, cal.samples, last_call_id, time.time()),
        )


# ---- work state and todos --------------------------------------------------------------------


def work_state(store: Store, conversation_id: int) -> dict[str, Any]:
    rows = store.query("SELECT state FROM work_state WHERE conversation_id = ?", (conversation_id,))
    return json.loads(rows[0][0]) if rows else {}


def set_work_state(store: Store, conversation_id: int, state: dict[str, Any]) -> None:
    with store.transaction() as c:
        if not state:
            c.execute("DELETE FROM work_state WHERE conversation_id = ?", (conversation_id,))
            return
        c.execute(
            "INSERT INTO work_state (conversation_id, state, updated) VALUES (?, ?, ?)"
            " ON CONFLICT(conversation_id) DO UPDATE SET state = excluded.state,"
            " updated = excluded.updated",
            (conversation_id, json.dumps(state, ensure_ascii=False, sort_keys=True), time.time()),
        )


@dataclass(frozen=True)
class Todo:
    id: int
    text: str
    status: str
    priority: str
    verified_by: str | None


def todos(store: Store, conversation_id: int) -> list[Todo]:
    rows = store.query(
        "SELECT id, text, status, priority, verified_by FROM todos WHERE conversation_id = ?"
        " ORDER BY id",
        (conversation_id,),
    )
    return [Todo(*r) for r in rows]
