"""The work state and the todos of a conversation (migration m003): what the agent keeps about
the work at hand, which survives compaction and is shown to the model after it.

Written by the work_state and todos tools, read by compaction's summaries; here in the store so
that neither imports the other. Synchronous and short, like the store's own functions.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from heron.store import Store


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


# The columns a todo's update may set (they name a column in the statement).
TODO_FIELDS = ("status", "priority", "verified_by")


def change_todos(
    store: Store, conversation_id: int, add: list[str], item: int | None, changes: dict[str, Any]
) -> None:
    """Add `add` as pending items and apply `changes` (None values left alone) to todo `item`,
    in one transaction. Raises LookupError, adding nothing, when `item` is not the
    conversation's."""
    now = time.time()
    with store.transaction() as c:
        for text in add:
            c.execute(
                "INSERT INTO todos (conversation_id, text, status, priority, created, updated)"
                " VALUES (?, ?, 'pending', ?, ?, ?)",
                (conversation_id, text, changes.get("priority") or "medium", now, now),
            )
        if item is None:
            return
        found = c.execute(
            "SELECT 1 FROM todos WHERE id = ? AND conversation_id = ?", (item, conversation_id)
        ).fetchone()
        if not found:
            raise LookupError(f"no todo #{item} in this conversation")
        for key, value in changes.items():
            if key not in TODO_FIELDS:
                raise ValueError(f"a todo has no field {key!r}")
            if value is not None:
                c.execute(
                    f"UPDATE todos SET {key} = ?, updated = ? WHERE id = ?", (value, now, item)
                )
