"""Goal conversations opened before a goal's nudge was kept out of titles were titled with the
nudge ("[Heron: your goal continues] Keep working…"), so every one read the same in a list.
They take their first goal's objective, cut as any title is."""

from __future__ import annotations

import sqlite3

from heron.messages import title_of

_NUDGE_TITLE = "[Heron: your goal continues]%"


def apply(conn: sqlite3.Connection) -> None:
    rows = conn.execute(
        "SELECT c.id, (SELECT g.objective FROM goals g WHERE g.conversation_key = c.key"
        " ORDER BY g.id LIMIT 1) FROM conversations c WHERE c.title LIKE ?",
        (_NUDGE_TITLE,),
    ).fetchall()
    for conversation_id, objective in rows:
        if objective is not None:
            conn.execute(
                "UPDATE conversations SET title = ? WHERE id = ?",
                (title_of(objective), conversation_id),
            )
