"""The trace's SQL: every statement on the trace tables (trace_blobs, trace_nodes, trace_runs,
trace_events) and on the turn's model_calls and tool_calls rows, in one place.

Only heron/trace/ imports this module. The functions are plain statements on a sqlite3
connection (inside the caller's transaction) or a Store; what they mean (content addressing,
chains, damage) is decided in blobs.py, recorder.py and read.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from heron.store import Store
from heron.store.pg import TRACE_GC, json_sql, later, pg_of

# ---- blobs and nodes (blobs.py) ---------------------------------------------------------------


def blob_id_by_digest(conn: sqlite3.Connection, digest: str) -> int | None:
    row = conn.execute("SELECT id FROM trace_blobs WHERE sha256 = ?", (digest,)).fetchone()
    return None if row is None else int(row[0])


def insert_blob(conn: sqlite3.Connection, digest: str, kind: str, body: str) -> int:
    """The new blob's id, or the id of the same blob another worker inserted meanwhile: on
    PostgreSQL two workers' transactions run side by side, so both may have looked and found
    nothing (on SQLite the caller's look and this insert are one writer's)."""
    return insert_blob_new(conn, digest, kind, body)[0]


def insert_blob_new(
    conn: sqlite3.Connection, digest: str, kind: str, body: str
) -> tuple[int, bool]:
    """`insert_blob`, and whether this insert made it (False: it was there already)."""
    cur = conn.execute(
        "INSERT OR IGNORE INTO trace_blobs (sha256, kind, body) VALUES (?, ?, ?)",
        (digest, kind, body),
    )
    if cur.rowcount == 1 and cur.lastrowid is not None:
        return cur.lastrowid, True
    found = blob_id_by_digest(conn, digest)
    assert found is not None
    return found, False


def inserts_first(conn: sqlite3.Connection) -> bool:
    """Whether a blob is inserted before it is looked up: on PostgreSQL, where each is a round
    trip (on SQLite the look is the cheaper of the two)."""
    return pg_of(conn) is not None


def blob_row(conn: sqlite3.Connection, blob_id: int) -> tuple[str, str] | None:
    """The (kind, body) of a blob, None when it is missing."""
    row = conn.execute("SELECT kind, body FROM trace_blobs WHERE id = ?", (blob_id,)).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def node_id(conn: sqlite3.Connection, parent: int, blob_id: int) -> int | None:
    row = conn.execute(
        "SELECT id FROM trace_nodes WHERE parent_id = ? AND blob_id = ?", (parent, blob_id)
    ).fetchone()
    return None if row is None else int(row[0])


def insert_node(conn: sqlite3.Connection, parent: int, blob_id: int) -> int:
    """The new node's id, or that of the same node another worker inserted meanwhile (as
    `insert_blob`)."""
    cur = conn.execute(
        "INSERT OR IGNORE INTO trace_nodes (parent_id, blob_id) VALUES (?, ?)", (parent, blob_id)
    )
    if cur.rowcount == 1 and cur.lastrowid is not None:
        return cur.lastrowid
    found = node_id(conn, parent, blob_id)
    assert found is not None
    return found


# The path from the start to a node, oldest first. A parent is always older than its child
# (lower id): the walk takes no other step, so a damaged chain ends short rather than looping.
_PATH = """WITH RECURSIVE path(id, parent_id, blob_id, depth) AS (
             SELECT id, parent_id, blob_id, 0 FROM trace_nodes WHERE id = ?
             UNION ALL
             SELECT n.id, n.parent_id, n.blob_id, path.depth + 1
             FROM trace_nodes n JOIN path ON n.id = path.parent_id AND n.id < path.id)
           SELECT {columns} FROM path JOIN trace_blobs b ON b.id = path.blob_id
           ORDER BY path.depth DESC"""


def path_digests(conn: sqlite3.Connection, node: int) -> list[tuple[str, int]]:
    """(blob sha256, node id) along the path to `node`, in one query."""
    cursor = conn.cursor()
    cursor.row_factory = None
    rows = cursor.execute(_PATH.format(columns="b.sha256, path.id"), (node,)).fetchall()
    return [(str(digest), int(n)) for digest, n in rows]


def path_blobs(conn: sqlite3.Connection, node: int) -> list[tuple[str, str]]:
    """(blob kind, blob body) along the path to `node`."""
    rows = conn.execute(_PATH.format(columns="b.kind, b.body"), (node,)).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


# On PostgreSQL, where blob and node ids are never taken again, only the trace's garbage
# collection voids a TraceCache: writers take this advisory lock shared for their transaction
# when they check their cache, the collection takes it alone, so no writer can name a blob the
# collection is deleting, and the next check after it sees the counter moved. The lock is the
# schema's own (a tenant's collection holds up no other tenant's writes).
_GC_LOCK = "1752, hashtext(current_schema())"


def data_version(conn: sqlite3.Connection) -> int:
    """Changes when another connection commits (SQLite's `PRAGMA data_version`); on PostgreSQL,
    when the trace's garbage is collected (the `heron_trace_gc` counter, read under the shared
    lock above: inside a write transaction, that holds off a collection until it ends)."""
    pg = pg_of(conn)
    if pg is not None:
        # One statement: the lock, then the counter (a sequence, read as it is now, not as of
        # the statement's snapshot; its subquery runs when its value is first needed, after
        # the lock's). tests/test_trace_gc.py holds the collection's lock to check the order.
        row = pg.execute(
            f"SELECT locked.held, (SELECT CASE WHEN is_called THEN last_value ELSE 0 END"
            f" FROM {TRACE_GC}) FROM (SELECT pg_advisory_xact_lock_shared({_GC_LOCK}) AS held)"
            " AS locked"
        ).fetchone()
        assert row is not None
        return int(row[1])
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def gc_epoch(conn: sqlite3.Connection) -> int:
    """How many times this connection collected garbage (its temp schema's user_version, which
    no other connection sees and a rollback restores); on PostgreSQL the counter `data_version`
    reads counts this connection's collections too: 0."""
    if pg_of(conn) is not None:
        return 0
    return int(conn.execute("PRAGMA temp.user_version").fetchone()[0])


def delete_unreached(conn: sqlite3.Connection, sections_kind: str) -> int:
    """Delete nodes and blobs no recorded request or run start reaches; returns how many rows
    went. A live blob of `sections_kind` keeps its sections alive."""
    pg = pg_of(conn)
    if pg is not None:
        pg.execute(f"SELECT pg_advisory_xact_lock({_GC_LOCK})")

    def ref(column: str, path: str) -> str:
        return json_sql(conn, column, path, integer=True)

    conn.execute("CREATE TEMP TABLE IF NOT EXISTS _live_nodes (id INTEGER PRIMARY KEY)")
    conn.execute("DELETE FROM _live_nodes")
    conn.execute(
        f"""INSERT OR IGNORE INTO _live_nodes
           WITH RECURSIVE seed(id) AS (
             SELECT {ref("request_ref", "$.messages[0]")} FROM model_calls
             WHERE request_ref IS NOT NULL AND {ref("request_ref", "$.messages[0]")} IS NOT NULL
             UNION SELECT {ref("start", "$.messages[0]")} FROM trace_runs
             WHERE {ref("start", "$.messages[0]")} IS NOT NULL),
           up(id) AS (
             SELECT id FROM seed
             UNION SELECT n.parent_id FROM trace_nodes n JOIN up ON n.id = up.id)
           SELECT id FROM up WHERE id > 0"""
    )
    gone = conn.execute("DELETE FROM trace_nodes WHERE id NOT IN (SELECT id FROM _live_nodes)")
    fields = [("model_calls", "request_ref", p) for p in ("$.system", "$.tools", "$.raw")]
    fields += [("trace_runs", "start", p) for p in ("$.tools", "$.system", "$.prompt_inputs")]
    refs = "SELECT blob_id FROM trace_nodes" + "".join(
        f" UNION SELECT {ref(column, path)} FROM {table}" for table, column, path in fields
    )
    # A sections blob's body is the JSON list of its sections' ids (only those are read as
    # JSON: PostgreSQL would fail on any other body).
    each = "jsonb_array_elements_text(s.body::jsonb) j" if pg is not None else "json_each(s.body) j"
    blobs = conn.execute(
        f"""WITH live(blob_id) AS ({refs})
            DELETE FROM trace_blobs WHERE id NOT IN (
              SELECT blob_id FROM live WHERE blob_id IS NOT NULL
              UNION SELECT {"j.value" if pg is None else "j::bigint"} FROM (
                SELECT body FROM trace_blobs WHERE kind = ? AND id IN (SELECT blob_id FROM live)
              ) s, {each})""",
        (sections_kind,),
    )
    # Deleted ids are taken again by the next inserts: this connection's TraceCache drops what
    # it knew (another connection's sees data_version change).
    if pg is not None:
        pg.execute(f"SELECT nextval('{TRACE_GC}')")
    else:
        conn.execute(f"PRAGMA temp.user_version = {gc_epoch(conn) + 1}")
    return gone.rowcount + blobs.rowcount


# ---- writing a run (recorder.py) --------------------------------------------------------------


def turn_start_ids(conn: sqlite3.Connection, turn_id: int) -> tuple[int, int | None] | None:
    """(conversation id, user message id) of a turn, None when there is no such turn."""
    row = conn.execute(
        "SELECT conversation_id, user_message_id FROM turns WHERE id = ?", (turn_id,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def insert_run_start(conn: sqlite3.Connection, turn_id: int, start: str, fingerprints: str) -> None:
    later(
        conn,
        "INSERT OR IGNORE INTO trace_runs (turn_id, start, fingerprints) VALUES (?, ?, ?)",
        (turn_id, start, fingerprints),
    )


def last_request_ref(conn: sqlite3.Connection, conversation_id: int) -> str | None:
    """The request_ref of the conversation's last model call stored by reference, in a turn
    (a maintenance run's requests, a summary's, are no prefix of the next turn's)."""
    row = conn.execute(
        "SELECT m.request_ref FROM model_calls m JOIN turns t ON t.id = m.turn_id"
        " WHERE t.conversation_id = ? AND t.kind = 'turn' AND m.request_ref IS NOT NULL"
        " ORDER BY m.id DESC LIMIT 1",
        (conversation_id,),
    ).fetchone()
    return None if row is None else str(row[0])


def previous_run_start(conn: sqlite3.Connection, conversation_id: int, turn_id: int) -> str | None:
    """The recorded start of the conversation's last run before `turn_id`."""
    row = conn.execute(
        "SELECT r.start FROM turns t JOIN trace_runs r ON r.turn_id = t.id"
        " WHERE t.conversation_id = ? AND t.kind = 'turn' AND t.id < ? ORDER BY t.id DESC LIMIT 1",
        (conversation_id, turn_id),
    ).fetchone()
    return None if row is None else str(row[0])


def insert_event(
    conn: sqlite3.Connection, turn_id: int, after: int, kind: str, body: str | None, at: float
) -> None:
    later(
        conn,
        "INSERT INTO trace_events (turn_id, after_call, kind, body, at) VALUES (?, ?, ?, ?, ?)",
        (turn_id, after, kind, body, at),
    )


def insert_model_call(conn: sqlite3.Connection, row: Sequence[object]) -> None:
    """`row`: turn_id, seq, purpose, request_ref, reply, error, the four token counts, started,
    ended, streamed (what a call stopped mid-stream had received, else None)."""
    later(
        conn,
        "INSERT INTO model_calls (turn_id, seq, purpose, request, request_ref, reply,"
        " error, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,"
        " started, ended, streamed) VALUES (?, ?, ?, '', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        tuple(row),
    )


def insert_tool_call(conn: sqlite3.Connection, row: Sequence[object]) -> None:
    """`row`: turn_id, call_id, name, args, result, result_sha256, is_error, effects, started,
    ended, after_call."""
    later(
        conn,
        "INSERT INTO tool_calls (turn_id, call_id, name, args, result, result_sha256,"
        " is_error, effects, started, ended, after_call)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        tuple(row),
    )


# ---- reading runs back (read.py, render.py) ---------------------------------------------------


def run_ids_like(store: Store, prefix: str) -> list[str]:
    rows = store.query("SELECT run_id FROM turns WHERE run_id LIKE ?", (f"{prefix}%",))
    return [r[0] for r in rows]


def model_call_rows(store: Store, turn_id: int) -> list[sqlite3.Row]:
    """In the order they were written, which is the order they were made: a turn that ran
    again after a context overflow numbers its second run's calls from 1 again (`seq`)."""
    return store.query("SELECT * FROM model_calls WHERE turn_id = ? ORDER BY id", (turn_id,))


def tool_call_rows(store: Store, turn_id: int) -> list[sqlite3.Row]:
    return store.query("SELECT * FROM tool_calls WHERE turn_id = ? ORDER BY id", (turn_id,))


def event_rows(store: Store, turn_id: int) -> list[sqlite3.Row]:
    return store.query("SELECT * FROM trace_events WHERE turn_id = ? ORDER BY id", (turn_id,))


def run_start_row(store: Store, turn_id: int) -> sqlite3.Row | None:
    """The trace_runs row (start, fingerprints) of a turn."""
    rows = store.query("SELECT start, fingerprints FROM trace_runs WHERE turn_id = ?", (turn_id,))
    return rows[0] if rows else None


def turn_message_rows(store: Store, turn_id: int) -> list[sqlite3.Row]:
    return store.query(
        "SELECT id, role, parts FROM messages WHERE turn_id = ? ORDER BY id", (turn_id,)
    )


def turn_rows(store: Store, conversation_key: str | None, limit: int) -> list[sqlite3.Row]:
    """Turns with their conversation key (`ckey`), newest first; one conversation's when
    `conversation_key` is given."""
    sql = "SELECT t.*, c.key AS ckey FROM turns t JOIN conversations c ON c.id = t.conversation_id"
    params: list[object] = []
    if conversation_key is not None:
        sql += " WHERE c.key = ?"
        params.append(conversation_key)
    sql += " ORDER BY t.started DESC, t.id DESC LIMIT ?"
    params.append(limit)
    return store.query(sql, params)


def turn_rows_since(store: Store, since: float) -> list[sqlite3.Row]:
    return store.query("SELECT * FROM turns WHERE started >= ? ORDER BY started", (since,))


# A request is stored by reference (blobs.py): its system and tools blobs, and its
# message list as the last node of a chain whose nodes each name one message blob. A request
# carried the needle when one of its blobs holds it, or when its chain passes through a node whose
# blob does (every node below such a node, in the tree of chains). Rows written before requests
# were stored by reference keep the whole payload in `request`.
_CARRYING = """
WITH RECURSIVE hit(id) AS (SELECT id FROM trace_blobs WHERE {found_in_body}),
below(id) AS (
  SELECT id FROM trace_nodes WHERE blob_id IN (SELECT id FROM hit)
  UNION SELECT n.id FROM trace_nodes n JOIN below ON n.parent_id = below.id)
SELECT c.key, mc.started, t.run_id, mc.seq, mc.purpose FROM model_calls mc
JOIN turns t ON t.id = mc.turn_id JOIN conversations c ON c.id = t.conversation_id
WHERE (mc.request_ref IS NULL AND {found_in_request})
   OR {system} IN (SELECT id FROM hit)
   OR {tools} IN (SELECT id FROM hit)
   OR {raw} IN (SELECT id FROM hit)
   OR {messages} IN (SELECT id FROM below)
ORDER BY mc.id DESC LIMIT ?"""


def requests_carrying_rows(store: Store, needle: str, limit: int) -> list[sqlite3.Row]:
    conn = store.conn
    find = "strpos({}, ?) > 0" if pg_of(conn) is not None else "instr({}, ?) > 0"
    sql = _CARRYING.format(
        found_in_body=find.format("body"),
        found_in_request=find.format("mc.request"),
        **{
            name: json_sql(conn, "mc.request_ref", f"$.{name}", integer=True)
            for name in ("system", "tools", "raw")
        },
        messages=json_sql(conn, "mc.request_ref", "$.messages[0]", integer=True),
    )
    return store.query(sql, (needle, needle, limit))


# ---- a forgotten secret taken out (forget.py) -------------------------------------------------


def _found(conn: sqlite3.Connection, column: str, needles: Sequence[str]) -> str:
    find = "strpos({}, ?) > 0" if pg_of(conn) is not None else "instr({}, ?) > 0"
    return " OR ".join([find.format(column)] * len(needles))


def blobs_holding(store: Store, needles: Sequence[str]) -> list[tuple[int, str]]:
    """(id, body) of every blob with one of `needles` in its body."""
    where = _found(store.conn, "body", needles)
    rows = store.query(f"SELECT id, body FROM trace_blobs WHERE {where}", tuple(needles))
    return [(int(r[0]), str(r[1])) for r in rows]


def inline_requests_holding(store: Store, needles: Sequence[str]) -> list[tuple[int, str]]:
    """(id, request) of every model call stored whole (before requests were stored by
    reference) with one of `needles` in it."""
    where = _found(store.conn, "request", needles)
    rows = store.query(f"SELECT id, request FROM model_calls WHERE {where}", tuple(needles))
    return [(int(r[0]), str(r[1])) for r in rows]


def rewrite_bodies(store: Store, blobs: dict[int, str], requests: dict[int, str]) -> None:
    """Store the blobs' and whole requests' texts anew; a blob keeps its sha256 (what it was
    stored under), so a chain that names it still reads."""
    with store.transaction() as c:
        for blob_id, body in blobs.items():
            c.execute("UPDATE trace_blobs SET body = ? WHERE id = ?", (body, blob_id))
        for call_id, request in requests.items():
            c.execute("UPDATE model_calls SET request = ? WHERE id = ?", (request, call_id))
