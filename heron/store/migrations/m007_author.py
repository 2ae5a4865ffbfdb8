"""Who wrote each message: the person, the model, a tool, or Heron itself.

Heron sends some user-role messages of its own (the continue and wrap-up prompts of a run,
summaries, recall injections): on the wire they are the user's turn, but they are not the
person's words. The author says so, so that no quote is ever verified against them and no
listing shows them as `you`.
"""

from __future__ import annotations

import sqlite3

# The runner's prompts as they were written before this step (heron/agent/runner.py).
_PROMPTS = (
    '[{"kind":"text","text":"Your reply was cut off by the output limit. Continue exactly '
    'where it stopped."}]',
    '[{"kind":"text","text":"The user asked you to stop. Do not call tools. Reply with a short '
    'summary of what is done and what is still pending, so the work can resume later."}]',
)
_WRAP_UP = '[{"kind":"text","text":"This run has reached its limit of %'
# Meta flags of rows Heron wrote itself (heron/memory/guard.py reads the same).
_FLAGS = ("synthetic", "injected", "injected_event", "recall", "summary", "subagent", "interrupted")


# A PostgreSQL database starts empty (there is no older Heron on it): the column only, and no
# backfill in SQLite's json functions.
POSTGRES_SQL = "ALTER TABLE messages ADD COLUMN author TEXT"


def apply(conn: sqlite3.Connection) -> None:
    # author: 'user' (the person typed it), 'model' (a reply of the model), 'tool' (tool
    # results, with any message the person typed meanwhile riding in the same row), 'heron'
    # (Heron wrote it). Only a 'user' row, or the text parts of a 'tool' row, is the person's.
    conn.execute("ALTER TABLE messages ADD COLUMN author TEXT")
    flagged = " OR ".join(f"json_extract(meta, '$.{flag}') IS NOT NULL" for flag in _FLAGS)
    marks = ", ".join("?" for _ in _PROMPTS)
    conn.execute(
        f"UPDATE messages SET author = 'heron' WHERE kind != 'message'"
        f" OR (meta IS NOT NULL AND json_valid(meta) AND ({flagged}))"
        f" OR (role = 'user' AND (parts IN ({marks}) OR parts LIKE ?))",
        (*_PROMPTS, _WRAP_UP),
    )
    conn.execute("UPDATE messages SET author = 'model' WHERE author IS NULL AND role = 'assistant'")
    conn.execute(
        "UPDATE messages SET author = 'tool' WHERE author IS NULL"
        ' AND instr(parts, \'"kind":"tool_result"\') > 0'
    )
    conn.execute("UPDATE messages SET author = 'user' WHERE author IS NULL")
