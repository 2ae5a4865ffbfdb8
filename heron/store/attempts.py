"""The attempts of one durable turn (heron/scale/): which turn rows a workflow already wrote.

A message run as a DBOS workflow gets run ids derived from its workflow id: `run_<h>` for the
first attempt, `run_<h>.<n>` for the n-th recovery. A worker that picks up a workflow whose
worker died reads the latest attempt here: none (start the turn), still `running` (its worker
died mid-turn: continue it from the record), or ended (it finished before the crash: nothing to
do). `close_for_resume` closes the dead attempt's tool phase by the engine's checkpoint rules
(finished results kept, the rest marked interrupted) without the stop marker a stopped turn
gets, because the turn is not over: the next attempt answers the same message.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from heron.store import engine_state as es
from heron.store.db import Store


@dataclass(frozen=True)
class Attempt:
    turn_id: int
    run_id: str
    status: str  # running, done, failed, interrupted
    user_message_id: int | None
    number: int  # 0 for the first attempt

    @property
    def open(self) -> bool:
        """Its worker died mid-turn: the next attempt continues it."""
        return self.status == "running"


def run_id_of(base: str, number: int) -> str:
    return base if number == 0 else f"{base}.{number}"


# Run ids looked up per statement: a first attempt, and three recoveries, in one round trip.
_BATCH = 4


def _rows(store: Store, base: str) -> list[tuple[int, str, str, int | None]]:
    """(turn id, run id, status, user message id) of every attempt of `base`, oldest first.

    By exact run ids, `base`, `base.1`, `base.2`..., a batch at a time until one is missing:
    the unique index on run_id answers each, where `LIKE 'base.%'` would scan every turn
    (neither SQLite nor PostgreSQL uses an index for LIKE under their default collations)."""
    found: list[tuple[int, str, str, int | None]] = []
    while True:
        ids = [run_id_of(base, len(found) + i) for i in range(_BATCH)]
        marks = ", ".join("?" * len(ids))
        rows = store.query(
            f"SELECT id, run_id, status, user_message_id FROM turns WHERE run_id IN ({marks})",
            ids,
        )
        by_id = {str(r[1]): (int(r[0]), str(r[1]), str(r[2]), r[3]) for r in rows}
        for run_id in ids:
            if run_id not in by_id:
                return found
            found.append(by_id[run_id])


def latest(store: Store, base: str) -> Attempt | None:
    """The newest turn row written under the run ids of `base`, or None."""
    rows = _rows(store, base)
    if not rows:
        return None
    turn_id, run_id, status, user_message_id = rows[-1]
    return Attempt(turn_id, run_id, status, user_message_id, len(rows) - 1)


def close_for_resume(store: Store, conversation_id: int) -> None:
    """Under the lease: the dead attempt's tool phase closed from its checkpoint, and its turn
    row marked interrupted ('recovered'); its user message stays unanswered for the next."""
    with store.transaction() as c:
        es.close_dangling_calls(store, conversation_id)
        c.execute(
            "UPDATE turns SET status = 'interrupted', stop_reason = 'recovered',"
            " ended = COALESCE(ended, ?) WHERE conversation_id = ? AND status = 'running'",
            (time.time(), conversation_id),
        )


def holds_mail(store: Store, key: str, base: str, ref: str) -> bool:
    """Whether a turn of conversation `key` run under the run ids of `base` stored the queued
    message `ref` as mail (heron/agent/control.py `Mail`): then that turn answered it. A ref
    is a hex message id, so it needs no escaping in LIKE."""
    turns = [row[0] for row in _rows(store, base)]
    if not turns:
        return False
    marks = ", ".join("?" * len(turns))
    rows = store.query(
        "SELECT 1 FROM messages m JOIN conversations c ON c.id = m.conversation_id"
        f" WHERE c.key = ? AND m.turn_id IN ({marks}) AND m.meta LIKE ? LIMIT 1",
        (key, *turns, f'%"{ref}"%'),
    )
    return bool(rows)
