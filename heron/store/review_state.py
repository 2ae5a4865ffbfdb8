"""Store functions of the nightly review of memory (table `review_cursor`, migration m009):
when it last ran, and which conversations have messages it has not read."""

from __future__ import annotations

import time

from heron.store.db import Store

# Conversations of internal work: nothing the person said is there to review.
INTERNAL = ("subagent:%", "cron:%", "heartbeat%", "internal:%", "dream:%")


def record_run(store: Store, name: str = "nightly") -> None:
    top = store.query("SELECT COALESCE(MAX(id), 0) FROM messages")[0][0]
    with store.transaction() as c:
        c.execute(
            "INSERT INTO review_cursor (name, message_id, ran) VALUES (?, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET message_id = excluded.message_id,"
            " ran = excluded.ran",
            (name, top, time.time()),
        )


def unreviewed(store: Store, limit: int = 50) -> list[int]:
    """Conversations with messages past their review cursor (memory_cursors), the ones with
    the oldest unread message first; internal work's conversations left out."""
    internal = " AND ".join("c.key NOT LIKE ?" for _ in INTERNAL)
    rows = store.query(
        "SELECT c.id, MIN(m.id) AS first FROM conversations c"
        " JOIN messages m ON m.conversation_id = c.id"
        " LEFT JOIN memory_cursors r ON r.conversation_id = c.id"
        f" WHERE m.id > COALESCE(r.reviewed_message_id, 0) AND {internal}"
        " GROUP BY c.id ORDER BY first LIMIT ?",
        (*INTERNAL, limit),
    )
    return [r[0] for r in rows]


def has_unread(store: Store, conversation_id: int) -> bool:
    """Whether the conversation has messages past its review cursor."""
    rows = store.query(
        "SELECT 1 FROM messages m LEFT JOIN memory_cursors r"
        " ON r.conversation_id = m.conversation_id WHERE m.conversation_id = ?"
        " AND m.id > COALESCE(r.reviewed_message_id, 0) LIMIT 1",
        (conversation_id,),
    )
    return bool(rows)
