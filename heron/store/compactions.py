"""The compactions of a conversation and the marks they put on its rows (migration m003).

Compaction writes them; the model-facing view (heron/context/history.py) reads them to replace
folded rows with their summary. A compaction never deletes nor rewrites a message row: it marks
it. Synchronous and short, like the store's own functions.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from heron.store import Store

log = logging.getLogger(__name__)


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
        _meta(r),
    )


def _meta(r: sqlite3.Row) -> dict[str, Any]:
    """A compaction's meta; a damaged one (not a JSON object) is read as none, so the fold
    still stands with its summary (what it carried in meta, the facts of a consolidation, is
    lost from it), and the log names the row: it made every turn of its conversation fail."""
    if not r["meta"]:
        return {}
    try:
        meta = json.loads(r["meta"])
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        log.warning("compaction #%s has a damaged meta; read without it", r["id"])
        return {}
    return meta


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


def set_tokens_after(store: Store, compaction_id: int, tokens: int) -> None:
    """The estimated size of the model-facing view once compaction `compaction_id` folded it."""
    with store.transaction() as c:
        c.execute("UPDATE compactions SET tokens_after = ? WHERE id = ?", (tokens, compaction_id))


def set_last_inflight_tokens_after(store: Store, conversation_id: int, tokens: int) -> None:
    """`set_tokens_after` for the conversation's latest in-flight compaction."""
    with store.transaction() as c:
        c.execute(
            "UPDATE compactions SET tokens_after = ? WHERE id = (SELECT MAX(id) FROM"
            " compactions WHERE conversation_id = ? AND kind = 'inflight')",
            (tokens, conversation_id),
        )
