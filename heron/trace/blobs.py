"""Content-addressed request storage: a payload in, a small reference out, the same bytes back.

A recorded request is split into its pieces: each message (canonical JSON) becomes a blob keyed
by its sha256, the message list becomes a path of nodes (one per message, parent first) so that
consecutive requests share their prefix, and the system block and the tools list become blobs of
their own. What is left of the payload (model, max_tokens, stream flags) is kept inline. Storage
therefore grows with what is new in each request, not with the length of the history.

`rebuild` returns the exact bytes that were recorded: a payload is only split when
`dumps(json.loads(payload)) == payload`, otherwise it is kept whole (a `raw` blob).

The functions take a sqlite3 connection (inside the caller's transaction) and know no store,
loop or wire.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from heron.messages import dumps
from heron.providers.wire import MESSAGES, encode_body

# Top-level payload fields stored as one blob each (when present).
BLOB_FIELDS = ("system", "tools")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def put_blob(conn: sqlite3.Connection, kind: str, body: str) -> int:
    """The id of the blob holding `body`, inserted on first sight."""
    digest = sha256(body)
    row = conn.execute("SELECT id FROM trace_blobs WHERE sha256 = ?", (digest,)).fetchone()
    if row is not None:
        return int(row[0])
    cur = conn.execute(
        "INSERT INTO trace_blobs (sha256, kind, body) VALUES (?, ?, ?)", (digest, kind, body)
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


def get_blob(conn: sqlite3.Connection, blob_id: int) -> str:
    row = conn.execute("SELECT body FROM trace_blobs WHERE id = ?", (blob_id,)).fetchone()
    if row is None:
        raise KeyError(f"trace blob {blob_id} is missing")
    return str(row[0])


def _node(conn: sqlite3.Connection, parent: int, blob_id: int) -> int:
    row = conn.execute(
        "SELECT id FROM trace_nodes WHERE parent_id = ? AND blob_id = ?", (parent, blob_id)
    ).fetchone()
    if row is not None:
        return int(row[0])
    cur = conn.execute(
        "INSERT INTO trace_nodes (parent_id, blob_id) VALUES (?, ?)", (parent, blob_id)
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


@dataclass
class ChainCache:
    """The last message chain written, as (sha256, node id) pairs, so the next request of the same
    run only looks up what it adds. Owned by one recorder; never shared."""

    links: list[tuple[str, int]] = field(default_factory=list)


def put_chain(conn: sqlite3.Connection, bodies: list[str], cache: ChainCache | None = None) -> int:
    """Store a list of message bodies as a path of nodes; returns the last node (0 if empty)."""
    digests = [sha256(b) for b in bodies]
    links = cache.links if cache else []
    shared = 0
    while shared < min(len(links), len(digests)) and links[shared][0] == digests[shared]:
        shared += 1
    new_links = links[:shared]
    parent = new_links[-1][1] if new_links else 0
    for digest, body in zip(digests[shared:], bodies[shared:], strict=True):
        parent = _node(conn, parent, put_blob(conn, "message", body))
        new_links.append((digest, parent))
    if cache is not None:
        cache.links = new_links
    return parent


def chain_links(conn: sqlite3.Connection, node_id: int) -> list[tuple[str, int]]:
    """(sha256, node id) along the path to `node_id`: seeds a ChainCache in one query. Plain
    tuples (no row factory): a long chain is thousands of rows, read on every run's start."""
    cursor = conn.cursor()
    cursor.row_factory = None
    rows = cursor.execute(
        """WITH RECURSIVE path(id, parent_id, blob_id, depth) AS (
             SELECT id, parent_id, blob_id, 0 FROM trace_nodes WHERE id = ?
             UNION ALL
             SELECT n.id, n.parent_id, n.blob_id, path.depth + 1
             FROM trace_nodes n JOIN path ON n.id = path.parent_id)
           SELECT b.sha256, path.id FROM path JOIN trace_blobs b ON b.id = path.blob_id
           ORDER BY path.depth DESC""",
        (node_id,),
    ).fetchall()
    return rows


def get_chain(conn: sqlite3.Connection, node_id: int) -> list[str]:
    """The message bodies on the path from the start to `node_id`, in order."""
    if node_id == 0:
        return []
    rows = conn.execute(
        """WITH RECURSIVE path(id, parent_id, blob_id, depth) AS (
             SELECT id, parent_id, blob_id, 0 FROM trace_nodes WHERE id = ?
             UNION ALL
             SELECT n.id, n.parent_id, n.blob_id, path.depth + 1
             FROM trace_nodes n JOIN path ON n.id = path.parent_id)
           SELECT b.body FROM path JOIN trace_blobs b ON b.id = path.blob_id
           ORDER BY path.depth DESC""",
        (node_id,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def put_payload(conn: sqlite3.Connection, payload: str, cache: ChainCache | None = None) -> str:
    """Store `payload` (a JSON body) by reference; returns the reference as JSON."""
    try:
        value = json.loads(payload)
    except ValueError:
        value = None
    body = encode_body(value) if isinstance(value, dict) else None
    if body is None or body.text != payload:
        # Not canonical JSON: keep it whole so it still rebuilds byte for byte.
        return dumps({"raw": put_blob(conn, "raw", payload)})
    return put_encoded(conn, value, body.pieces, cache)


def put_encoded(
    conn: sqlite3.Connection,
    value: dict[str, Any],
    pieces: dict[str, list[str]],
    cache: ChainCache | None = None,
) -> str:
    """`put_payload` for a body already encoded field by field (heron/providers/wire.py): the
    pieces must be the canonical encoding of `value`'s fields, messages one per message."""
    value = dict(value)
    ref: dict[str, Any] = {}
    messages = value.pop(MESSAGES, None)
    if isinstance(messages, list):
        ref[MESSAGES] = [put_chain(conn, pieces[MESSAGES], cache), len(messages)]
    elif messages is not None:
        value[MESSAGES] = messages
    for name in BLOB_FIELDS:
        if name in value:
            value.pop(name)
            ref[name] = put_blob(conn, name, pieces[name][0])
    ref["rest"] = value
    return dumps(ref)


def rebuild(conn: sqlite3.Connection, ref_json: str) -> str:
    """The exact payload bytes a reference was made from."""
    ref = json.loads(ref_json)
    if "raw" in ref:
        return get_blob(conn, ref["raw"])
    value: dict[str, Any] = dict(ref["rest"])
    if MESSAGES in ref:
        node, count = ref[MESSAGES]
        bodies = get_chain(conn, node)
        if len(bodies) != count:
            raise ValueError(f"message chain ends after {len(bodies)} of {count} messages")
        value[MESSAGES] = [json.loads(b) for b in bodies]
    for name in BLOB_FIELDS:
        if name in ref:
            value[name] = json.loads(get_blob(conn, ref[name]))
    return dumps(value)


def collect_garbage(conn: sqlite3.Connection) -> int:
    """Delete nodes and blobs no recorded request or run start reaches any more (after a
    conversation was deleted); returns how many rows went."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS _live_nodes (id INTEGER PRIMARY KEY)")
    conn.execute("DELETE FROM _live_nodes")
    conn.execute(
        """INSERT OR IGNORE INTO _live_nodes
           WITH RECURSIVE seed(id) AS (
             SELECT json_extract(request_ref, '$.messages[0]') FROM model_calls
             WHERE request_ref IS NOT NULL AND json_extract(request_ref, '$.messages') IS NOT NULL
             UNION SELECT json_extract(start, '$.messages[0]') FROM trace_runs
             WHERE json_extract(start, '$.messages') IS NOT NULL),
           up(id) AS (
             SELECT id FROM seed
             UNION SELECT n.parent_id FROM trace_nodes n JOIN up ON n.id = up.id)
           SELECT id FROM up WHERE id > 0"""
    )
    gone = conn.execute("DELETE FROM trace_nodes WHERE id NOT IN (SELECT id FROM _live_nodes)")
    refs = """SELECT blob_id FROM trace_nodes
              UNION SELECT json_extract(request_ref, '$.system') FROM model_calls
              UNION SELECT json_extract(request_ref, '$.tools') FROM model_calls
              UNION SELECT json_extract(request_ref, '$.raw') FROM model_calls
              UNION SELECT json_extract(start, '$.tools') FROM trace_runs
              UNION SELECT json_extract(start, '$.system') FROM trace_runs
              UNION SELECT json_extract(start, '$.prompt_inputs') FROM trace_runs"""
    blobs = conn.execute(
        f"DELETE FROM trace_blobs WHERE id NOT IN (SELECT * FROM ({refs}) WHERE blob_id NOT NULL)"
    )
    return gone.rowcount + blobs.rowcount
