"""The compaction state kept per conversation and per model (migration m003): failure counts,
the idle retry and the token calibration. The compactions themselves and their row marks are
in heron/store/compactions.py, where the model-facing view reads them too.

Functions are synchronous and short, like the store's own; the async side calls them through
`asyncio.to_thread`. Nothing here deletes or rewrites a message row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from heron.context.tokens import Calibration
from heron.store import Store

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


# ---- idle compaction ------------------------------------------------------------------------


def idle_conversations(
    store: Store, cutoff: float, now: float, conversation_id: int | None = None
) -> list[tuple[int, str]]:
    """(id, agent) of the conversations last updated before `cutoff`, with a history, no
    running turn and no idle retry pending at `now` (of `conversation_id` alone, if given)."""
    one = "" if conversation_id is None else " AND c.id = ?"
    rows = store.query(
        "SELECT c.id, c.agent FROM conversations c"
        " LEFT JOIN context_state s ON s.conversation_id = c.id"
        " WHERE c.updated < ? AND c.head_id IS NOT NULL"
        " AND COALESCE(s.idle_retry_after, 0) <= ?" + one + " AND NOT EXISTS"
        " (SELECT 1 FROM turns t WHERE t.conversation_id = c.id"
        " AND t.status = 'running' AND t.kind = 'turn')",
        (cutoff, now) if conversation_id is None else (cutoff, now, conversation_id),
    )
    return [(int(r[0]), str(r[1])) for r in rows]


def head_of(store: Store, conversation_id: int) -> int | None:
    """The conversation's newest message on its current branch (None: empty or gone)."""
    rows = store.query("SELECT head_id FROM conversations WHERE id = ?", (conversation_id,))
    return rows[0][0] if rows else None
