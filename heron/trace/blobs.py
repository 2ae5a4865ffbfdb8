"""Content-addressed request storage: a payload in, a small reference out, the same bytes back.

A recorded request is split into its pieces: each message (canonical JSON) becomes a blob keyed
by its sha256, the message list becomes a path of nodes (one per message, parent first) so that
consecutive requests share their prefix, and the system block and the tools list become blobs of
their own. What is left of the payload (model, max_tokens, stream flags) is kept inline. Storage
therefore grows with what is new in each request, not with the length of the history.

`rebuild` returns the exact bytes that were recorded: a payload is only split when
`dumps(json.loads(payload)) == payload`, otherwise it is kept whole (a `raw` blob).

The functions take a sqlite3 connection (inside the caller's transaction) and know no store,
loop or wire. `TraceCache` is what one connection's trace writes already know to be on disk, so
a steady-state request looks up only what it adds (its owner keeps it valid: see the class).
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from heron.messages import dumps
from heron.providers.wire import MESSAGES, encode_body
from heron.trace import records

# Top-level payload fields stored as one blob each (when present).
BLOB_FIELDS = ("system", "tools")
# A message chain as (sha256, node id, the body when known): with the body in hand, the next
# request compares its messages with it and hashes only those that differ.
Link = tuple[str, int, str | None]
# What a TraceCache keeps: chain links in all (a link holds its message body) and blobs by body.
CACHE_LINKS = 100_000
CACHE_BLOBS = 64


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def put_blob(conn: sqlite3.Connection, kind: str, body: str, digest: str | None = None) -> int:
    """The id of the blob holding `body` (whose sha256 is `digest`), inserted on first sight.
    A large body made of sections (a system prompt, in a message or not) is stored as its
    sections, each a blob of its own: a prompt whose archived summary changed adds that
    section, not the whole prompt again."""
    return _put_blob(conn, kind, body, digest)[0]


def _put_blob(
    conn: sqlite3.Connection, kind: str, body: str, digest: str | None = None
) -> tuple[int, bool]:
    """`put_blob`, and whether this call inserted the blob (then no node names it yet). A
    small body on PostgreSQL is inserted first and read back only when it was there: one
    round trip for a new blob (most are: a turn's new messages), two for a known one."""
    digest = digest or sha256(body)
    pieces = split_body(body)
    if len(pieces) == 1 and records.inserts_first(conn):
        return records.insert_blob_new(conn, digest, kind, body)
    found = records.blob_id_by_digest(conn, digest)
    if found is not None:
        return found, False
    if len(pieces) > 1:
        ids = [put_blob(conn, SECTION, piece) for piece in pieces]
        kind, body = SECTIONS, dumps(ids)
    return records.insert_blob(conn, digest, kind, body), True


# A body of SECTIONS is the JSON list of its SECTION blobs; the sha256 is the whole body's.
SECTIONS, SECTION = "sections", "section"
SECTIONED_MIN = 4_000  # characters: smaller bodies are stored whole
_CUTS = re.compile(r'(?=\n\n# )|(?=\\n\\n# )|(?<=",)(?=")')  # headings, raw or in JSON; fields
PIECE_MIN = 512  # characters: cut points closer than this are merged


def split_body(body: str) -> list[str]:
    """`body` cut before each top-level heading of a prompt (raw, or escaped inside a JSON
    string) and between the fields of a JSON object; `"".join` gives it back."""
    if len(body) < SECTIONED_MIN:
        return [body]
    pieces: list[str] = []
    start = 0
    for m in _CUTS.finditer(body):
        if m.start() - start >= PIECE_MIN:
            pieces.append(body[start : m.start()])
            start = m.start()
    pieces.append(body[start:])
    return pieces


def _body(conn: sqlite3.Connection, kind: str, body: str) -> str:
    if kind != SECTIONS:
        return body
    return "".join(get_blob(conn, int(i)) for i in json.loads(body))


def get_blob(conn: sqlite3.Connection, blob_id: int) -> str:
    row = records.blob_row(conn, blob_id)
    if row is None:
        raise KeyError(f"trace blob {blob_id} is missing")
    return _body(conn, *row)


def _node(
    conn: sqlite3.Connection, parent: int, blob_id: int, new: bool = False
) -> tuple[int, bool]:
    """The node of `blob_id` after `parent`, inserted on first sight, and whether it was. `new`:
    the parent or the blob was just inserted (by this transaction, whose rows no other sees
    yet): no node joins them."""
    if not new:
        found = records.node_id(conn, parent, blob_id)
        if found is not None:
            return found, False
    return records.insert_node(conn, parent, blob_id), True


@dataclass
class ChainCache:
    """The last message chain written, so the next request looks up only what it adds. Owned by
    one recorder; the list is replaced, never changed in place, so a TraceCache may hold it."""

    links: list[Link] = field(default_factory=list)


def put_chain(conn: sqlite3.Connection, bodies: list[str], cache: ChainCache | None = None) -> int:
    """Store a list of message bodies as a path of nodes; returns the last node (0 if empty)."""
    new_links = _shared(cache.links if cache else [], bodies)
    parent = new_links[-1][1] if new_links else 0
    new = False  # the last node was inserted: every one after it is new too
    for body in bodies[len(new_links) :]:
        digest = sha256(body)
        blob_id, new_blob = _put_blob(conn, "message", body, digest)
        parent, new = _node(conn, parent, blob_id, new or new_blob)
        new_links.append((digest, parent, body))
    if cache is not None:
        cache.links = new_links
    return parent


def _shared(links: list[Link], bodies: list[str]) -> list[Link]:
    """The links of the prefix `bodies` shares with `links`, each with its body. A link that
    holds its body is compared by text (the same string as last time costs no hash); one read
    from the database (no body) by digest."""
    out: list[Link] = []
    for link, body in zip(links, bodies, strict=False):
        digest, node, known = link
        if known is not None:
            if known is not body and known != body:
                break
            out.append(link)
        elif sha256(body) == digest:
            out.append((digest, node, body))
        else:
            break
    return out


def chain_links(conn: sqlite3.Connection, node_id: int) -> list[Link]:
    """The links along the path to `node_id` (bodies not read: compared by digest), in one
    query; seeds a ChainCache when no TraceCache knows the chain."""
    rows = records.path_digests(conn, node_id)
    return [(digest, node, None) for digest, node in rows]


def get_chain(conn: sqlite3.Connection, node_id: int) -> list[str]:
    """The message bodies on the path from the start to `node_id`, in order. A parent is always
    older than its child (lower id): the walk takes no other step, so a damaged chain ends short
    (and `rebuild` says so) rather than looping."""
    if node_id == 0:
        return []
    rows = records.path_blobs(conn, node_id)
    return [_body(conn, kind, body) for kind, body in rows]


class TraceCache:
    """What one connection's trace writes know to be on disk: per conversation the links of the
    last message chain written, and blob ids by body (system prompts, tools, prompt inputs).
    Both bounded, least recently used first out.

    Its owner keeps it true. Only committed rows enter (`keep`, called after COMMIT: a rolled
    back node's id is taken again by the next insert). Ids are reused after `collect_garbage`,
    so `check`, inside each write transaction (after BEGIN IMMEDIATE: no other connection can
    commit before it ends), drops everything when another connection committed since the last
    check (SQLite's data_version) or this one collected garbage (`gc_epoch`)."""

    def __init__(self, max_links: int = CACHE_LINKS, max_blobs: int = CACHE_BLOBS) -> None:
        self.max_links, self.max_blobs = max_links, max_blobs
        self._chains: OrderedDict[int, list[Link]] = OrderedDict()
        self._links = 0  # links held in `_chains`
        self._blobs: OrderedDict[str, int] = OrderedDict()
        self._version: tuple[int, int] | None = None  # what the entries were checked against

    def check(self, conn: sqlite3.Connection) -> None:
        version = (records.data_version(conn), records.gc_epoch(conn))
        if version != self._version:
            self._chains.clear()
            self._blobs.clear()
            self._links = 0
            self._version = version

    def chain(self, conversation_id: int) -> list[Link] | None:
        links = self._chains.get(conversation_id)
        if links is not None:
            self._chains.move_to_end(conversation_id)
        return links

    def blob(self, body: str) -> int | None:
        found = self._blobs.get(body)  # the same string as last time: no hash, no compare
        if found is not None:
            self._blobs.move_to_end(body)
        return found

    def keep(self, conversation_id: int | None, links: list[Link], blobs: dict[str, int]) -> None:
        """After COMMIT: `links` is the conversation's last chain written, `blobs` the blob ids
        the transaction found or inserted."""
        for body, blob_id in blobs.items():
            self._blobs[body] = blob_id
            self._blobs.move_to_end(body)
        while len(self._blobs) > self.max_blobs:
            self._blobs.popitem(last=False)
        if conversation_id is None:
            return
        old = self._chains.pop(conversation_id, None)
        self._links -= len(old) if old is not None else 0
        if not links or len(links) > self.max_links:
            return
        self._chains[conversation_id] = links
        self._links += len(links)
        while self._links > self.max_links:
            self._links -= len(self._chains.popitem(last=False)[1])


@dataclass
class KnownBlobs:
    """Blob ids by body for one write transaction: the cache's, then what this transaction found
    or inserted (`found`, for the cache to keep once the transaction commits)."""

    cache: TraceCache | None = None
    found: dict[str, int] = field(default_factory=dict)

    def blob(self, conn: sqlite3.Connection, kind: str, body: str) -> int:
        blob_id = self.found.get(body)
        if blob_id is None and self.cache is not None:
            blob_id = self.cache.blob(body)
        if blob_id is None:
            blob_id = self.found[body] = put_blob(conn, kind, body)
        return blob_id


def put_payload(
    conn: sqlite3.Connection,
    payload: str,
    cache: ChainCache | None = None,
    known: KnownBlobs | None = None,
) -> str:
    """Store `payload` (a JSON body) by reference; returns the reference as JSON."""
    try:
        value = json.loads(payload)
    except ValueError:
        value = None
    body = encode_body(value) if isinstance(value, dict) else None
    if body is None or body.text != payload:
        # Not canonical JSON: keep it whole so it still rebuilds byte for byte.
        return dumps({"raw": put_blob(conn, "raw", payload)})
    return put_encoded(conn, value, body.pieces, cache, known)


def put_encoded(
    conn: sqlite3.Connection,
    value: dict[str, Any],
    pieces: dict[str, list[str]],
    cache: ChainCache | None = None,
    known: KnownBlobs | None = None,
) -> str:
    """`put_payload` for a body already encoded field by field (heron/providers/wire.py): the
    pieces must be the canonical encoding of `value`'s fields, messages one per message.
    `known`: the system and tools blobs (the same on most requests) by body."""
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
            text = pieces[name][0]
            ref[name] = known.blob(conn, name, text) if known else put_blob(conn, name, text)
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
    return records.delete_unreached(conn, SECTIONS)
