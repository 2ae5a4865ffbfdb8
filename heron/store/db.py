"""The SQLite store: one file under HERON_HOME, WAL, foreign keys, migrations on open.

Methods are synchronous and short. Every write runs in one `BEGIN IMMEDIATE` transaction, so a
crash at any instant leaves either all of a save or none of it.

From async code, one way (no raw `asyncio.to_thread` on a store function;
tests/test_architecture_sql.py checks): `await store.call(fn, ...)` runs an operation inline, on
the event loop, when it is bounded by the few rows it touches (a turn's indexed statements in
short transactions); `store.call(fn, ..., off_loop=True)` runs on a worker thread what grows
with the data (a long branch, old traces). Why the line is drawn there, with the figures, is in
docs/performance.md ("Store calls").

The one wait an inline call can meet is another process's write transaction (busy_timeout);
every writer here keeps its transactions short, so that wait is short too.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from heron.errors import HeronError, StoreError, StoreLocked, StoreRefused
from heron.messages import (
    File,
    Message,
    Part,
    Text,
    Usage,
    parts_from_json,
    parts_to_json,
)
from heron.store.disk import damaged, locked, refusal
from heron.store.files import FileStore
from heron.store.home_lock import other_serve
from heron.store.migrations import migrate
from heron.store.pg import REWRITES, PgConnection, is_url, later, pg_of, row_lock
from heron.store.pg_url import redact
from heron.store.records import (
    TURN,
    Conversation,
    StoredMessage,
    Turn,
    author_for,
    internal_sql,
    stored_time,
)

HEAD = object()  # sentinel: append after the conversation's current head
T = TypeVar("T")
LONG_BRANCH = 2_000  # rows: a branch at least this long is read off the loop (`off_loop`)
# Decoded branches a Store keeps: bounded by rows (memory) rather than by conversations, so an
# engine serving hundreds of short conversations at once does not evict each one before its
# next turn (a bound of 64 conversations did exactly that at 100).
BRANCH_CACHE_ROWS = 100_000
# Seconds a statement waits for another process's lock on the SQLite file before it fails.
BUSY_TIMEOUT_S = 30.0

# The branch to a head (?1), walked down towards the root: from the row after ?2 when ?2 is on
# it, and no further down than the first row whose id is at most ?3 (0: to the root). A row's
# parent is always older, so its id is lower: with ?3 on the branch, the walk ends at ?3.
_BRANCH_SQL = """WITH RECURSIVE chain(id) AS (
     SELECT ? UNION ALL
     SELECT m.parent_id FROM messages m JOIN chain ON m.id = chain.id
     WHERE m.parent_id IS NOT NULL AND m.parent_id != ? AND m.id > ?)
   SELECT m.* FROM messages m JOIN chain ON m.id = chain.id ORDER BY m.id"""

# Each row of the branch to a head (?), with who wrote it and its turn's message, no parts.
_INDEX_SQL = """WITH RECURSIVE chain(id) AS (
     SELECT ? UNION ALL
     SELECT m.parent_id FROM messages m JOIN chain ON m.id = chain.id
     WHERE m.parent_id IS NOT NULL)
   SELECT m.id, m.turn_id, m.role, m.kind, m.author, t.user_message_id
   FROM messages m JOIN chain ON m.id = chain.id LEFT JOIN turns t ON t.id = m.turn_id
   ORDER BY m.id"""


# The turns whose message is on the chain from the conversation's head to its root.
_BRANCH_TURNS_SQL = f"""WITH RECURSIVE chain(id) AS (
     SELECT head_id FROM conversations WHERE id = ? AND head_id IS NOT NULL UNION ALL
     SELECT m.parent_id FROM messages m JOIN chain ON m.id = chain.id
     WHERE m.parent_id IS NOT NULL)
   SELECT COUNT(*) FROM turns t JOIN chain ON t.user_message_id = chain.id
   WHERE t.conversation_id = ? AND t.kind = '{TURN}'"""


@dataclass(frozen=True)
class BranchRow:
    """One row of a branch as `Store.branch_index` reads it."""

    id: int
    turn_id: int | None
    role: str
    kind: str
    author: str | None
    turn_message: int | None  # the message that opened its turn


class ConnectionCache(Protocol):
    """A cache another layer keeps of one connection's committed rows; it checks, inside each
    write transaction, that no other connection committed since (`PRAGMA data_version`)."""

    def check(self, conn: sqlite3.Connection) -> None: ...


class Store:
    def __init__(
        self,
        path: Path | str,
        files: Path | None = None,
        *,
        reading: bool = False,
        busy_timeout: float = BUSY_TIMEOUT_S,
    ) -> None:
        # A postgresql:// URL opens the PostgreSQL store (heron/store/pg.py, docs/scale.md);
        # anything else is the SQLite file.
        self.url: str | None = str(path) if is_url(path) else None
        self.path = Path("postgresql") if self.url else Path(path)
        # Attachment bytes (heron/store/files.py): in `files`, else the `files` folder beside
        # the SQLite file; in memory for a database in memory (or a server's without `files`).
        if files is None and not self.url and str(path) != ":memory:":
            files = self.path.parent / "files"
        self.files = FileStore(files)
        self._lock = threading.RLock()
        self._branch_len: dict[int, int] = {}  # conversation id -> rows in its last branch read
        # conversation id -> (head id, the decoded branch to it): see `branch`.
        self._branches = _KeptBranches()
        self._data_version = -1  # PRAGMA data_version when `_branches` was last known valid
        self._rewrites = 0  # rewrites of stored rows by this Store: a read across one is not kept
        self._committed: list[StoredMessage] = []  # appended in the open transaction
        # Run after the open transaction commits, dropped if it rolls back: how a cache of other
        # layers (the trace's, `trace_cache`) takes in only committed rows.
        self.after_commit: list[Callable[[], None]] = []
        # What the trace's writes know to be on disk through this connection (heron/trace/
        # blobs.py's TraceCache, made by the trace on first use): dropped when the connection
        # reopens, since the ids it holds belong to the old one's file.
        self.trace_cache: ConnectionCache | None = None
        # `reading`: a command that only reads (list, show, search, export, recall) opens a
        # home whose disk refuses writes (read-only, full) read-only rather than failing;
        # `read_only` then says why, for the command to tell the person.
        self.reading = reading
        self.read_only: StoreRefused | None = None
        # How long a statement waits for another process's lock before it fails: long for
        # a command that must write; `heron status` asks for a short one, to answer at once.
        self.busy_timeout = busy_timeout
        self.conn = self._connect()
        # (device, inode): see `check_file`; a server's database has no file to watch.
        self._file = None if self.url else _file_id(self.path)

    @property
    def backend(self) -> str:
        return "postgresql" if self.url else "sqlite"

    def describe(self) -> str:
        """Where the data is, for messages: the file, or the URL without its password."""
        return redact(self.url) if self.url else str(self.path)

    def _connect(self) -> sqlite3.Connection:
        if self.url:
            # PgConnection speaks the subset of sqlite3.Connection the store uses.
            pg = PgConnection(self.url)
            conn = cast(sqlite3.Connection, pg)
            migrate(conn, postgres=True, where=f"the database {redact(self.url)}")
            pg.read_catalog()  # the tables as migrated, by this process or another (pg.py)
            return conn
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout,
            )
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            try:
                migrate(conn, where=f"the database {self.path}", guard=self._no_serve)
            except StoreError:  # refused (a newer database, a serve running): nothing kept open
                conn.close()
                raise
        except sqlite3.DatabaseError as e:
            refused = refusal(e, self.path)
            if refused is not None and self.reading:
                return self._connect_reading(refused)
            raise _open_error(self.path, e, refused) from e
        return conn

    def _no_serve(self, steps: list[str]) -> None:
        """Refuses to migrate the home's database while a `heron serve` (another process,
        perhaps an older Heron) runs on it: that serve would go on writing with the schema it
        knows. The home is the database's folder (HERON_HOME/heron.db); on PostgreSQL the
        serve's lock is one machine's, and this check is not made (docs/engine.md, "Upgrades")."""
        if str(self.path) == ":memory:":
            return
        serve = other_serve(self.path.parent)
        if serve is None:
            return
        raise StoreError(
            f"heron serve runs on {self.path.parent} ({serve}) with an older Heron: this one "
            f"would migrate the database under it ({_steps(steps)})",
            hint="Stop heron serve (Ctrl-C in its terminal, or kill its pid) and run this "
            "again, or restart heron serve with this Heron: it migrates the database as it "
            "starts.",
        )

    def _connect_reading(self, refused: StoreRefused) -> sqlite3.Connection:
        """The database opened read-only for a command that only reads: through its WAL when
        SQLite can share it (mode=ro), else as a file nobody writes (immutable=1: a read-only
        folder where no -shm file can be made)."""
        last: sqlite3.DatabaseError | None = None
        for flag in ("mode=ro", "immutable=1"):
            uri = f"{self.path.absolute().as_uri()}?{flag}"
            try:
                conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
                conn.row_factory = sqlite3.Row
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
                # nothing to apply, or refused: a read-only open cannot upgrade (nor read a
                # database a newer Heron migrated: StoreError, as in `_connect`)
                migrate(conn, where=f"the database {self.path}")
            except sqlite3.DatabaseError as e:
                last = e
                continue
            self.read_only = refused
            return conn
        assert last is not None
        raise _open_error(self.path, last, refused) from last

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def check_file(self) -> str | None:
        """Whether the database file is still the one this Store opened (same device and
        inode; checked at every turn, one stat). If it was deleted, the open connection still
        holds it: it is written back to its path first, so nothing is lost; if another file
        took its place, that one is used. Either way the store reopens and the warning to
        show is returned; None when nothing changed."""
        if self._file is None:
            return None  # in memory
        now = _file_id(self.path)
        if now == self._file:
            return None
        with self._lock:
            if now is None:
                self._write_back()
                warning = (
                    f"the database {self.path} was deleted while Heron had it open; it was "
                    "written back from the open copy, and nothing is lost"
                )
            else:
                self.conn.close()
                warning = f"the database {self.path} was replaced by another file; using that one"
            self.conn = self._connect()
            self._file = _file_id(self.path)
            self._data_version = -1
            self._branch_len.clear()
            self.trace_cache = None
        self._forget_branches()
        return warning

    def _write_back(self) -> None:
        """Copy the open (deleted) database to a new file at its path. The copy is made beside
        it and moved in: the old WAL files at the path belong to the open connection, and are
        removed when it closes."""
        staging = self.path.with_name(f"{self.path.name}.restore-{os.getpid()}")
        copy = sqlite3.connect(staging)
        try:
            self.conn.backup(copy)
        finally:
            copy.close()
        self.conn.close()
        if self.path.exists():  # someone put a file there meanwhile: theirs wins, ours stays
            return
        os.replace(staging, self.path)

    async def call(
        self, fn: Callable[..., T], *args: Any, off_loop: bool = False, **kwargs: Any
    ) -> T:
        """Run a store operation from async code: inline on the event loop when it touches a
        bounded number of rows (see the module docstring for why this beats a thread hop), on
        a worker thread (`off_loop=True`) when its cost grows with the data (a long branch, a
        search, every row of a conversation)."""
        if off_loop:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    def is_long(self, conversation_id: int) -> bool:
        """Whether the conversation's branch is long enough that reading it belongs off the
        loop (`call(..., off_loop=True)`): its length at the last read, else its message count
        (one index lookup)."""
        known = self._branch_len.get(conversation_id)
        if known is None:
            rows = self.query(
                "SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (conversation_id,)
            )
            known = self._branch_len[conversation_id] = rows[0][0]
        return known >= LONG_BRANCH

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; a nested call joins the outer one."""
        with self._lock:
            if self.conn.in_transaction:
                yield self.conn
                return
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError as e:
                self._raise_refused(e)
                raise
            try:
                yield self.conn
            except BaseException as e:
                self._roll_back()
                self._raise_refused(e)
                raise
            # A failed COMMIT keeps nothing and runs no hook.
            hooks, self.after_commit = self.after_commit, []
            appended, self._committed = self._committed, []
            try:
                self.conn.execute("COMMIT")
            except sqlite3.DatabaseError as e:
                # SQLite may have rolled back already (a full disk, an I/O error); otherwise
                # the transaction is still open, and the next `transaction()` would join it.
                self._roll_back()
                self._raise_refused(e)
                raise
            for stored in appended:
                self._keep_appended(stored)
            for hook in hooks:
                hook()

    def _roll_back(self) -> None:
        self._committed.clear()
        self.after_commit.clear()
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def _raise_refused(self, error: BaseException) -> None:
        """Raise the disk's refusal behind a failed write (full, read-only) in its place."""
        if self.url or isinstance(error, HeronError):
            return
        refused = refusal(error, self.path)
        if refused is not None:
            raise refused from error

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self.conn.execute(sql, params).fetchall()
            except sqlite3.OperationalError as e:
                if "decode" not in str(e):
                    raise
                return self._query_replacing(sql, params)

    def _query_replacing(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        """A row holds text that is not valid UTF-8 (damaged, or written by another program):
        read it with the bad bytes replaced by U+FFFD rather than fail the whole read. Only
        then: decoding every value in Python costs a third more on a long branch."""
        self.conn.text_factory = _replacing
        try:
            return self.conn.execute(sql, params).fetchall()
        finally:
            self.conn.text_factory = str

    # ---- conversations ----------------------------------------------------------------------

    def conversation(self, key: str) -> Conversation | None:
        rows = self.query("SELECT * FROM conversations WHERE key = ?", (key,))
        return _conversation(rows[0]) if rows else None

    def conversation_by_id(self, conversation_id: int) -> Conversation:
        rows = self.query("SELECT * FROM conversations WHERE id = ?", (conversation_id,))
        if not rows:
            raise StoreError(f"no conversation with id {conversation_id}")
        return _conversation(rows[0])

    def open_conversation(self, key: str, agent: str = "default") -> Conversation:
        """The conversation named `key`, created on first use."""
        found = self.conversation(key)  # every turn opens its conversation: read first
        if found is not None:
            return found
        now = time.time()
        with self.transaction() as c:
            c.execute(
                "INSERT OR IGNORE INTO conversations (key, agent, created, updated)"
                " VALUES (?, ?, ?, ?)",
                (key, agent, now, now),
            )
        found = self.conversation(key)
        assert found is not None
        return found

    def conversations(
        self, limit: int = 50, *, internal: bool = False, offset: int = 0, named: str = ""
    ) -> list[Conversation]:
        """Most recently active first, from the `offset`-th on; Heron's internal ones
        (records.is_internal) only when asked for; with `named`, only those whose title or key
        holds it (any case). A conversation without a message yet (a chat left unused, a
        command on a new key) is no conversation to the person: never listed."""
        where, params = ["TRUE"], []
        if not internal:
            hidden, hidden_params = internal_sql()
            where += [f"NOT {hidden}", "head_id IS NOT NULL"]
            params += list(hidden_params)
        if named:
            pattern = (
                "%"
                + named.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                + "%"
            )
            where.append(
                "(LOWER(COALESCE(title, '')) LIKE ? ESCAPE '\\' OR LOWER(key) LIKE ? ESCAPE '\\')"
            )
            params += [pattern, pattern]
        rows = self.query(
            f"SELECT * FROM conversations WHERE {' AND '.join(where)}"
            " ORDER BY updated DESC, id DESC LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [_conversation(r) for r in rows]

    def conversation_count(self) -> int:
        """How many conversations `conversations()` lists in all (internal and empty aside)."""
        hidden, params = internal_sql()
        rows = self.query(
            f"SELECT COUNT(*) FROM conversations WHERE NOT {hidden} AND head_id IS NOT NULL",
            params,
        )
        return int(rows[0][0])

    def drop_if_empty(self, conversation_id: int) -> bool:
        """Delete the conversation if nothing was ever said in it and nobody uses it (no turn
        holds it, no chat has it open): what a command on a new key, or a chat left without a
        message, leaves behind. True when it was deleted."""
        with self.transaction() as c:
            gone = c.execute(
                "DELETE FROM conversations WHERE id = ? AND head_id IS NULL"
                " AND NOT EXISTS (SELECT 1 FROM messages WHERE conversation_id = ?)"
                " AND NOT EXISTS (SELECT 1 FROM turn_leases WHERE conversation_id = ?)"
                " AND NOT EXISTS (SELECT 1 FROM presence WHERE conversation_id = ?)",
                (conversation_id,) * 4,
            )
            return bool(gone.rowcount)

    def set_title(self, conversation_id: int, title: str) -> None:
        with self.transaction() as c:
            later(c, "UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def set_head(self, conversation_id: int, head_id: int | None) -> None:
        with self.transaction() as c:
            c.execute(
                "UPDATE conversations SET head_id = ?, updated = ? WHERE id = ?",
                (head_id, time.time(), conversation_id),
            )

    def load_files(self, messages: Sequence[Message]) -> list[Message]:
        """`messages` with their attachments' bytes (heron/store/files.py): what a request to
        a model needs; a part whose bytes are gone stays without them."""
        return self.files.load_messages(messages)

    def delete_conversation(self, conversation_id: int) -> None:
        self._forget_branches()
        with self.transaction() as c:
            c.execute("UPDATE conversations SET head_id = NULL WHERE id = ?", (conversation_id,))
            # Each message names its parent (ON DELETE CASCADE): a cascade from the first goes
            # down the chain one level per message, past SQLite's 1,000 levels of recursion.
            # Cut the chain first, then every row goes at one level.
            c.execute(
                "UPDATE messages SET parent_id = NULL WHERE conversation_id = ?"
                " AND parent_id IS NOT NULL",
                (conversation_id,),
            )
            c.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            c.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # ---- messages ---------------------------------------------------------------------------

    def append(
        self,
        conversation_id: int,
        message: Message,
        *,
        parent_id: Any = HEAD,
        sent: Message | None = None,
        kind: str = "message",
        turn_id: int | None = None,
        meta: dict[str, Any] | None = None,
        author: str | None = None,
    ) -> StoredMessage:
        """Append a message after `parent_id` (default: the head) and make it the new head.
        `author` (user, model, tool, heron) is derived from the message when not given."""
        now = time.time()
        author = author or author_for(message, kind, meta)
        # The bytes first: a row never names a file that is not kept.
        self.files.keep(message.parts)
        if sent is not None:
            self.files.keep(sent.parts)
        raw = parts_to_json(message.parts)
        sent_raw = parts_to_json(sent.parts) if sent is not None else None
        meta_raw = json.dumps(meta) if meta else None
        row = (turn_id, message.role, kind, raw, sent_raw, meta_raw, now, author)
        with self.transaction() as c:
            if pg_of(c) is not None:
                new_id, parent_id = _append_pg(c, conversation_id, parent_id, row)
            else:
                new_id, parent_id = _append_sqlite(c, conversation_id, parent_id, row)
            stored = StoredMessage(
                new_id,
                conversation_id,
                parent_id,
                turn_id,
                kind,
                message,
                sent,
                now,
                meta or {},
                author,
            )
            self._committed.append(_as_read(stored, raw, sent_raw, meta_raw))
        return stored

    def branch(self, conversation_id: int, head_id: int | None = None) -> list[StoredMessage]:
        """The messages from the root to `head_id` (default: the conversation's head), in order.

        Decoded branches are kept per conversation, keyed by their head: rows are never
        rewritten through the Store except by `update_meta`, `rewrite_sent` and deletes (which
        drop the cache), so a branch to a head that descends from the cached one only reads the
        rows after it.
        A commit by any other connection (another process) drops the cache (data_version); on
        PostgreSQL, another worker's rewrite of stored rows does (`heron_rewrites`)."""
        rows = list(self._chain(conversation_id, head_id, None) or ())
        self._branch_len[conversation_id] = len(rows)
        return rows

    def branch_since(
        self, conversation_id: int, floor_id: int, head_id: int | None = None
    ) -> list[StoredMessage]:
        """The end of the branch to `head_id` (default: the head), in order: every row whose id
        is at least `floor_id`, and the one below them (the root if none is). A parent is older
        than its child, so ids fall along the branch: when row `floor_id` is on it, the list
        starts with that row. Only those rows are read (those the kept branch lacks), so the
        part of a long conversation before a consolidation is never fetched nor decoded."""
        rows = self._chain(conversation_id, head_id, floor_id) or []
        at = _start_of(rows, floor_id)
        self._branch_len[conversation_id] = len(rows) - at  # what the next read costs
        return rows[at:]

    def branch_index(self, conversation_id: int) -> list[BranchRow]:
        """Who wrote each row of the branch to the head, root first, without its parts: what a
        reader of one page of a long branch needs to place that page and number the person's
        messages over the whole branch (heron/web/transcript.py), at a few small values a row
        where decoding them all costs the whole branch's parts. Not kept: it is read fresh."""
        head_id, _ = self._head(conversation_id)
        if head_id is None:
            return []
        rows = self.query(_INDEX_SQL, (head_id,))
        return [BranchRow(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    def messages_of(self, conversation_id: int, ids: Sequence[int]) -> list[StoredMessage]:
        """The rows `ids` of a conversation (ascending, as a branch's are), decoded: the rows
        between the first and the last are read, and only those asked for are decoded."""
        if not ids:
            return []
        wanted = set(ids)
        rows = self.query(
            "SELECT * FROM messages WHERE conversation_id = ? AND id BETWEEN ? AND ? ORDER BY id",
            (conversation_id, min(ids), max(ids)),
        )
        return _messages([r for r in rows if r["id"] in wanted])

    def turns_between(
        self, conversation_id: int, turns: tuple[int, int], messages: tuple[int, int]
    ) -> list[Turn]:
        """The conversation's turns whose id is in `turns` (inclusive) or whose message is
        in `messages`: those a page of a branch shows or follows."""
        rows = self.query(
            f"SELECT * FROM turns WHERE conversation_id = ? AND kind = '{TURN}' AND (id BETWEEN"
            " ? AND ? OR user_message_id BETWEEN ? AND ?) ORDER BY id",
            (conversation_id, *turns, *messages),
        )
        return [turn_from_row(r) for r in rows]

    def _chain(
        self, conversation_id: int, head_id: int | None, floor_id: int | None
    ) -> list[StoredMessage] | None:
        """The kept or freshly read chain to the head: from the root (`floor_id` None) or from
        a row whose id is at most `floor_id`; None: no head. The list may be the kept one: the
        callers copy it."""
        with self._lock:
            version = None
            if head_id is None:
                head_id, version = self._head(conversation_id)
                if head_id is None:
                    return None
            cached = self._cached_branch(conversation_id, version)
            if cached is not None and not _covers(cached[1], floor_id):
                cached = None
            if cached is None or cached[0] != head_id:
                stop = cached[0] if cached is not None else 0
                raw = self.query(_BRANCH_SQL, (head_id, stop, floor_id or 0))
                remember = not self.conn.in_transaction
                rewrites = self._rewrites
        if cached is not None and cached[0] == head_id:
            rows = cached[1]
        else:  # decoded outside the lock: a long branch on a worker must not hold up the loop
            new = _messages(raw)
            extends = cached is not None and bool(new) and new[0].parent_id == stop
            rows = cached[1] + new if extends and cached is not None else new
            if remember and _covers(rows, floor_id):
                with self._lock:
                    if rewrites == self._rewrites:
                        self._branches.put(conversation_id, head_id, rows)
        return rows

    def _head(self, conversation_id: int) -> tuple[int | None, int | None]:
        """The conversation's head, and on PostgreSQL the rewrites counter `_cached_branch`
        checks, read in the same statement (the counter, a sequence, as it is now)."""
        if pg_of(self.conn) is None:
            return self.conversation_by_id(conversation_id).head_id, None
        rows = self.query(
            "SELECT head_id, (SELECT CASE WHEN is_called THEN last_value ELSE 0 END"
            f" FROM {REWRITES}) FROM conversations WHERE id = ?",
            (conversation_id,),
        )
        if not rows:
            raise StoreError(f"no conversation with id {conversation_id}")
        return rows[0][0], int(rows[0][1])

    def _cached_branch(
        self, conversation_id: int, version: int | None = None
    ) -> tuple[int, list[StoredMessage]] | None:
        """The kept branch, once checked against `version` (read now when not given): the
        rewrites counter on PostgreSQL, SQLite's data_version."""
        if self.conn.in_transaction:  # rows read now may yet be rolled back (and ids reused)
            return None
        if version is None:
            pg = pg_of(self.conn)
            if pg is not None:
                # Another worker's appends move the head, which is read every time; only a
                # rewrite of stored rows voids a kept branch (docs/scale.md, "Caches").
                version = pg.counter(REWRITES)
            else:
                version = self.conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._branches.clear()
            self._data_version = version
        return self._branches.get(conversation_id)

    def _keep_appended(self, stored: StoredMessage) -> None:
        """A committed append extends the kept branch it continues, from the message in hand:
        the next turn's read of the branch then neither fetches nor decodes it."""
        kept = self._branches.get(stored.conversation_id)
        if kept is None or kept[0] != stored.parent_id:
            return
        self._branches.put(stored.conversation_id, stored.id, [*kept[1], stored])
        known = self._branch_len.get(stored.conversation_id)
        if known is not None:
            self._branch_len[stored.conversation_id] = known + 1

    def _forget_branches(self) -> None:
        with self._lock:
            self._rewrites += 1
            self._branches.clear()
            pg = pg_of(self.conn)
            if pg is not None:  # and every other worker's, once the rewrite commits
                pg.bump_on_commit.add(REWRITES)

    def message(self, message_id: int) -> StoredMessage:
        rows = self.query("SELECT * FROM messages WHERE id = ?", (message_id,))
        if not rows:
            raise StoreError(f"no message with id {message_id}")
        return _message(rows[0])

    def children(self, message_id: int) -> list[StoredMessage]:
        rows = self.query("SELECT * FROM messages WHERE parent_id = ? ORDER BY id", (message_id,))
        return [_message(r) for r in rows]

    def all_messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.query(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        )
        return _messages(rows)

    def update_meta(self, message_id: int, meta: dict[str, Any]) -> None:
        self._forget_branches()  # a rewrite of a stored row
        with self.transaction() as c:
            c.execute("UPDATE messages SET meta = ? WHERE id = ?", (json.dumps(meta), message_id))

    def sent_holding(self, needles: Sequence[str]) -> list[tuple[int, str]]:
        """(id, sent_parts) of every message sent with one of `needles` in it, as stored."""
        found = "strpos(sent_parts, ?) > 0" if pg_of(self.conn) else "instr(sent_parts, ?) > 0"
        where = " OR ".join([found] * len(needles))
        if not where:
            return []
        rows = self.query(
            f"SELECT id, sent_parts FROM messages WHERE sent_parts IS NOT NULL AND ({where})",
            tuple(needles),
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    def rewrite_sent(self, sent: dict[int, str]) -> None:
        """Store each message's parts as sent (JSON, `parts_to_json`) anew: a forgotten
        secret's words taken out of what every later request of its conversation replays
        (heron/memory/service.py). The record (`parts`) is not touched."""
        if not sent:
            return
        self._forget_branches()  # a rewrite of stored rows
        with self.transaction() as c:
            for message_id, raw in sent.items():
                c.execute("UPDATE messages SET sent_parts = ? WHERE id = ?", (raw, message_id))

    # ---- turns ------------------------------------------------------------------------------

    def begin_turn(
        self,
        conversation_id: int,
        run_id: str,
        message: Message,
        *,
        sent: Message | None = None,
        provider: str | None = None,
        model: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> tuple[int, StoredMessage]:
        """Open a turn and commit the user's message with it, in one transaction: the message is
        on disk before the first model call."""
        with self.transaction():
            turn_id = self.start_turn(
                conversation_id, run_id, user_message_id=None, provider=provider, model=model
            )
            stored = self.append(conversation_id, message, sent=sent, turn_id=turn_id, meta=meta)
            later(
                self.conn, "UPDATE turns SET user_message_id = ? WHERE id = ?", (stored.id, turn_id)
            )
        return turn_id, stored

    def start_turn(
        self,
        conversation_id: int,
        run_id: str,
        *,
        user_message_id: int | None,
        provider: str | None,
        model: str | None,
        kind: str = TURN,
        process: tuple[str, int] | None = None,
    ) -> int:
        """A `turns` row, running. `kind`: `turn`, or what a maintenance run is (m025);
        `process`: the (host, pid) running it, for a run no lease tells dead (m027)."""
        host, pid = process or (None, None)
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO turns (conversation_id, run_id, user_message_id, status, provider,"
                " model, started, kind, host, pid) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    run_id,
                    user_message_id,
                    provider,
                    model,
                    time.time(),
                    kind,
                    host,
                    pid,
                ),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def finish_turn(
        self,
        turn_id: int,
        *,
        status: str,
        stop_reason: str | None,
        usage: Usage,
        model_calls: int,
        tool_calls: int,
        system_fingerprint: str | None = None,
        error: str | None = None,
        usage_unknown: bool = False,
    ) -> None:
        with self.transaction() as c:
            later(
                c,
                "UPDATE turns SET status = ?, stop_reason = ?, input_tokens = ?,"
                " output_tokens = ?, cache_read_tokens = ?, cache_write_tokens = ?,"
                " model_calls = ?, tool_calls = ?, system_fingerprint = ?, error = ?,"
                " usage_unknown = ?, ended = ? WHERE id = ?",
                (
                    status,
                    stop_reason,
                    usage.input,
                    usage.output,
                    usage.cache_read,
                    usage.cache_write,
                    model_calls,
                    tool_calls,
                    system_fingerprint,
                    error,
                    int(usage_unknown),
                    time.time(),
                    turn_id,
                ),
            )

    def turns(
        self, conversation_id: int, limit: int | None = None, *, maintenance: bool = False
    ) -> list[Turn]:
        """The conversation's turns, oldest first; with `maintenance`, the runs Heron made
        outside any turn too (/compact, memory reviews: what its cost includes)."""
        sql = "SELECT * FROM turns WHERE conversation_id = ?"
        sql += " ORDER BY id" if maintenance else f" AND kind = '{TURN}' ORDER BY id"
        rows = self.query(sql, (conversation_id,))
        turns = [turn_from_row(r) for r in rows]
        return turns[-limit:] if limit else turns

    def turn_count(self, conversation_id: int) -> int:
        sql = f"SELECT COUNT(*) FROM turns WHERE conversation_id = ? AND kind = '{TURN}'"
        return int(self.query(sql, (conversation_id,))[0][0])

    def branch_counts(self, conversation_id: int) -> tuple[int, int]:
        """(the turns of the current branch: those whose message is on the head's chain, as
        the person sees them; the conversation's branches, its leaves as /tree lists them).
        A retried answer's turn, on the branch it left, is not counted."""
        turns = self.query(_BRANCH_TURNS_SQL, (conversation_id, conversation_id))[0][0]
        # Each row that is some row's parent is no leaf (a row's parent is of its conversation).
        leaves = self.query(
            "SELECT COUNT(*) - COUNT(DISTINCT parent_id) FROM messages WHERE conversation_id = ?",
            (conversation_id,),
        )[0][0]
        return int(turns), int(leaves)

    def running_turn(self, conversation_id: int) -> Turn | None:
        """The conversation's latest turn while it is still running (`heron status`)."""
        rows = self.query(
            f"SELECT * FROM turns WHERE conversation_id = ? AND kind = '{TURN}'"
            " ORDER BY id DESC LIMIT 1",
            (conversation_id,),
        )
        turn = turn_from_row(rows[0]) if rows else None
        return turn if turn is not None and turn.status == "running" else None

    def running_turn_message(self, conversation_id: int) -> int | None:
        """The user message of the conversation's latest turn while it is still running."""
        turn = self.running_turn(conversation_id)
        return None if turn is None else turn.user_message_id

    def last_separator(self, conversation_id: int) -> float:
        """When the conversation's last /new separator was written (0 before any): the turns
        after it are the model's current context, which /status describes."""
        rows = self.query(
            "SELECT MAX(created) FROM messages WHERE conversation_id = ? AND kind = 'separator'",
            (conversation_id,),
        )
        return float(rows[0][0] or 0) if rows else 0.0

    def created_of(self, ids: Sequence[int]) -> dict[int, float]:
        """When each of these conversations that still exists was created (by primary key)."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.query(f"SELECT id, created FROM conversations WHERE id IN ({marks})", ids)
        return {int(row[0]): float(row[1]) for row in rows}

    def used_tool(self, conversation_id: int, tool: str) -> bool:
        """Whether a finished call of `tool` is on record in the conversation since its last
        /new separator (what its model may still count on): one query, on the turns' and the
        tool calls' indexes, stopping at the first found."""
        rows = self.query(
            "SELECT 1 FROM turns t JOIN tool_calls c ON c.turn_id = t.id"
            " WHERE t.conversation_id = ? AND c.name = ? AND t.started > COALESCE("
            "(SELECT MAX(created) FROM messages WHERE conversation_id = ? AND kind = 'separator'),"
            " 0) LIMIT 1",
            (conversation_id, tool, conversation_id),
        )
        return bool(rows)

    def last_call_tokens(self, conversation_id: int) -> int:
        """Input plus output tokens of the conversation's last model call (0 before any): the
        context it used, as /status shows."""
        rows = self.query(
            "SELECT m.input_tokens + m.output_tokens FROM model_calls m JOIN turns t"
            f" ON t.id = m.turn_id WHERE t.conversation_id = ? AND t.kind = '{TURN}'"
            " ORDER BY m.id DESC LIMIT 1",
            (conversation_id,),
        )
        return int(rows[0][0]) if rows else 0

    def rewound_copy(self, conversation_id: int, head_id: int | None, since: float) -> Store:
        """An in-memory copy of the store with the conversation's head at `head_id` and the
        compactions made at or after `since` removed (their marks go with them): the store as
        a turn that started then found it (`heron trace replay`)."""
        copy = Store(":memory:")
        copy.files = self.files  # the same attachments: a replay sends what the turn sent
        if self.url:
            self._copy_rows(copy.conn)
        else:
            self.conn.backup(copy.conn)  # a consistent snapshot (not inside a write transaction)
        with copy.transaction() as c:
            sql = "UPDATE conversations SET head_id = ? WHERE id = ?"
            c.execute(sql, (head_id, conversation_id))
            c.execute(
                "DELETE FROM compactions WHERE conversation_id = ? AND created >= ?",
                (conversation_id, since),
            )
        return copy

    def follow(self, conversation_id: int, message: Message, turn_id: int) -> int | None:
        """Make the head's child that turn `turn_id` wrote holding `message` (its role and
        parts as `append` writes them) the new head, and return its id; None when the head has
        no such child. A replay, on a `rewound_copy`, walks the recorded turn's rows this way
        while it writes what they hold: each keeps the id the run gave it, which the view can
        quote (a checkpoint names the mail typed during its turn by row, `[#938]`), and the
        meta, which a trace's mailbox event does not keep (a subagent result's run, a worker's
        mail refs)."""
        parts = parts_to_json(message.parts)
        with self.transaction() as c:
            rows = c.execute(
                "SELECT m.id, m.role, m.parts FROM messages m"
                " JOIN conversations v ON v.id = m.conversation_id AND m.parent_id = v.head_id"
                " WHERE v.id = ? AND m.turn_id = ? ORDER BY m.id",
                (conversation_id, turn_id),
            ).fetchall()
            found = next((r[0] for r in rows if (r[1], r[2]) == (message.role, parts)), None)
            if found is not None:
                c.execute(
                    "UPDATE conversations SET head_id = ? WHERE id = ?", (found, conversation_id)
                )
        return int(found) if found is not None else None

    def _copy_rows(self, copy: sqlite3.Connection) -> None:
        """Every row of this PostgreSQL store into `copy`, a fresh SQLite store (its schema
        made by the same migrations): what `backup` does on SQLite. The rows are read in one
        REPEATABLE READ transaction, so the copy is one consistent snapshot; each table's
        columns are SQLite's (PostgreSQL's `body_tsv` stays behind: the copy's triggers index
        the text in FTS5 again). A replay reads the copy as a turn reads its store (branch,
        compactions, marks), none of it by the backend's own search, so the copy is faithful
        to what the recorded turn found."""
        tables = [
            r[0]
            for r in copy.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                " AND name NOT LIKE 'messages_fts%' AND name != '_migrations'"
            )
        ]
        copy.execute("PRAGMA foreign_keys=OFF")  # head_id and parent_id point both ways
        copy.execute("BEGIN")
        with self._lock:
            self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                for table in tables:
                    columns = [r[1] for r in copy.execute(f"PRAGMA table_info({table})")]
                    names = ", ".join(columns)
                    rows = self.conn.execute(f"SELECT {names} FROM {table}").fetchall()
                    marks = ", ".join("?" * len(columns))
                    copy.executemany(  # OR REPLACE: rows the migrations wrote (the review job)
                        f"INSERT OR REPLACE INTO {table} ({names}) VALUES ({marks})",
                        [tuple(r) for r in rows],
                    )
            finally:
                self.conn.execute("ROLLBACK")
        copy.execute("COMMIT")
        copy.execute("PRAGMA foreign_keys=ON")

    def turn(self, run_id: str) -> Turn | None:
        rows = self.query("SELECT * FROM turns WHERE run_id = ?", (run_id,))
        return turn_from_row(rows[0]) if rows else None


_MESSAGE_COLUMNS = (
    "conversation_id, parent_id, turn_id, role, kind, parts, sent_parts, meta, created, author"
)


def _append_sqlite(
    c: sqlite3.Connection, conversation_id: int, parent_id: Any, row: tuple[Any, ...]
) -> tuple[int, int | None]:
    """`append`'s row on SQLite, whose BEGIN IMMEDIATE holds every other writer off: read the
    head, insert, move the head. (The new id and its parent.)"""
    if parent_id is HEAD:
        found = c.execute(
            "SELECT head_id FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if found is None:
            raise StoreError(f"no conversation with id {conversation_id}")
        parent_id = found[0]
    cur = c.execute(
        f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (conversation_id, parent_id, *row),
    )
    assert cur.lastrowid is not None
    c.execute(
        "UPDATE conversations SET head_id = ?, updated = ? WHERE id = ?",
        (cur.lastrowid, row[6], conversation_id),
    )
    return cur.lastrowid, parent_id


def _append_pg(
    c: sqlite3.Connection, conversation_id: int, parent_id: Any, row: tuple[Any, ...]
) -> tuple[int, int | None]:
    """`append`'s row on PostgreSQL in one statement (three on SQLite): the head read under
    the conversation's row lock, held until the transaction ends (two appends would otherwise
    both read the old head and fork the branch), the insert, the head moved. No row: no such
    conversation. The values are cast: in a SELECT list an untyped parameter is text."""
    if parent_id is HEAD:
        parent, lock, params = "c.head_id", row_lock(c), [conversation_id]
    else:
        parent, lock, params = "?::bigint", "", [parent_id, conversation_id]
    found = c.execute(
        f"WITH m AS (INSERT INTO messages ({_MESSAGE_COLUMNS})"
        f" SELECT c.id, {parent}, ?::bigint, ?, ?, ?, ?, ?, ?::double precision, ?"
        f" FROM conversations c WHERE c.id = ?{lock} RETURNING id, parent_id)"
        " UPDATE conversations SET head_id = m.id, updated = ? FROM m"
        " WHERE conversations.id = ? RETURNING m.id, m.parent_id",
        (*params[:-1], *row, params[-1], row[6], conversation_id),
    ).fetchone()
    if found is None:
        raise StoreError(f"no conversation with id {conversation_id}")
    return int(found[0]), found[1]


def _as_read(
    stored: StoredMessage, raw: str, sent_raw: str | None, meta: str | None
) -> StoredMessage:
    """An appended row as a read would give it back (the parts with their stored JSON, the meta
    through JSON), not the caller's own objects: what the branch cache keeps once committed."""
    sent = stored.sent
    return StoredMessage(
        stored.id,
        stored.conversation_id,
        stored.parent_id,
        stored.turn_id,
        stored.kind,
        _StoredParts.decoded(stored.message, raw, stored.id),
        _StoredParts.decoded(sent, sent_raw, stored.id) if sent and sent_raw else None,
        stored.created,
        json.loads(meta) if meta else {},
        stored.author,
    )


class _KeptBranches:
    """Decoded branches by conversation, each with the head it was read to; the oldest kept
    go once they hold more than BRANCH_CACHE_ROWS rows in all."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[int, list[StoredMessage]]] = {}
        self._rows = 0

    def get(self, conversation_id: int) -> tuple[int, list[StoredMessage]] | None:
        return self._kept.get(conversation_id)

    def put(self, conversation_id: int, head_id: int, rows: list[StoredMessage]) -> None:
        self._drop(conversation_id)
        self._kept[conversation_id] = (head_id, rows)
        self._rows += len(rows)
        while self._rows > BRANCH_CACHE_ROWS and len(self._kept) > 1:
            self._drop(next(iter(self._kept)))

    def clear(self) -> None:
        self._kept.clear()
        self._rows = 0

    def rows(self) -> int:
        return self._rows

    def _drop(self, conversation_id: int) -> None:
        gone = self._kept.pop(conversation_id, None)
        if gone is not None:
            self._rows -= len(gone[1])


def _covers(rows: list[StoredMessage], floor_id: int | None) -> bool:
    """Whether a chain holds what is asked: the whole branch (from the root) for None, else
    every row from `floor_id` on (it starts from the root or at a row at most `floor_id`)."""
    if not rows or rows[0].parent_id is None:
        return True
    return floor_id is not None and rows[0].id <= floor_id


def _start_of(rows: list[StoredMessage], floor_id: int) -> int:
    """Index of the last row whose id is at most `floor_id` (0: none is), searched from the
    end: the floor is recent."""
    for i in range(len(rows) - 1, -1, -1):
        if rows[i].id <= floor_id:
            return i
    return 0


def _steps(names: list[str]) -> str:
    """Migrations to apply, for a message: "m024_x" or "3 steps, m022_a to m024_c"."""
    if len(names) == 1:
        return names[0]
    return f"{len(names)} steps, {names[0]} to {names[-1]}"


def _conversation(r: sqlite3.Row) -> Conversation:
    return Conversation(
        r["id"],
        r["key"],
        r["agent"],
        r["title"],
        r["head_id"],
        r["epoch"],
        r["created"],
        r["updated"],
    )


def _open_error(path: Path, error: sqlite3.DatabaseError, refused: StoreError | None) -> StoreError:
    """Why the database did not open: the disk's refusal (full, read-only) as it is; damage
    with the advice to move the file aside; anything else as SQLite said it, with no advice
    that could cost the person their history."""
    if refused is not None:
        return refused
    if isinstance(error, sqlite3.OperationalError) and locked(error):
        return StoreLocked(
            f"cannot open the database {path}: {error}",
            hint="Another program holds it locked (an SQLite tool, a backup): try again in a"
            " moment, or close that program.",
        )
    hint = "If the file is damaged, move it aside; Heron creates a fresh one."
    return StoreError(
        f"cannot open the database {path}: {error}", hint=hint if damaged(error) else None
    )


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the database file; None in memory or when it is gone."""
    if str(path) == ":memory:":
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _replacing(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _parts(raw: Any, row_id: int) -> tuple[list[Part], bool]:
    """Decode a row's parts, and whether they decoded: a corrupt row (not JSON, not a list of
    parts, a number where text belongs) becomes a visible placeholder, never a crash."""
    if isinstance(raw, bytes):  # stored as a BLOB: its text, invalid bytes replaced
        raw = raw.decode("utf-8", errors="replace")
    try:
        return parts_from_json(raw), True
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        text = f"[message #{row_id} could not be read ({e}); its raw text: {str(raw)[:2000]}]"
        return [Text(text)], False


class _StoredParts(Message):
    """A stored message whose parts are decoded on first use.

    Loading a branch reads every row of it, but after a consolidation the model sees only the
    rows after the fold: decoding the folded thousands up front was most of the cost of a turn
    on a long conversation. It is a `Message` in every way that matters (role, parts, equality
    with a plain Message, hashing); a corrupt row decodes to a visible placeholder."""

    def __init__(self, role: str, raw: str, row_id: int) -> None:
        object.__setattr__(self, "role", role)
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_row_id", row_id)

    @classmethod
    def decoded(cls, message: Message, raw: str, row_id: int) -> _StoredParts:
        """A message just written as `raw`: its parts are the ones in hand, not decoded."""
        out = cls(message.role, raw, row_id)
        object.__setattr__(out, "_readable", True)
        parts = message.parts
        if any(isinstance(p, File) for p in parts):  # as read back: bytes are not kept in rows
            parts = tuple(p.without_data() if isinstance(p, File) else p for p in parts)
        object.__setattr__(out, "parts", tuple(parts))
        return out

    @property
    def parts_json(self) -> str | None:
        """The parts as stored, canonical JSON (written by `parts_to_json`), so a trace takes
        them as they are (heron.messages.message_json); None for a corrupt row, whose
        placeholder part is encoded instead. Decodes the parts first if not done yet."""
        self.parts  # noqa: B018 - decoded first: only a row that decodes is reused
        return self._raw if self.__dict__["_readable"] else None

    def __getattr__(self, name: str) -> Any:
        if name != "parts":
            raise AttributeError(name)
        parts, readable = _parts(self._raw, self._row_id)
        object.__setattr__(self, "_readable", readable)
        object.__setattr__(self, "parts", tuple(parts))
        return self.parts

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (self.role, self.parts) == (other.role, other.parts)

    def __hash__(self) -> int:
        return hash((self.role, self.parts))

    def __repr__(self) -> str:
        return f"Message(role={self.role!r}, parts={self.parts!r})"


def _messages(rows: list[sqlite3.Row]) -> list[StoredMessage]:
    # Thousands of small objects and no reference cycles: the cyclic collector would only
    # rescan them (a third of the time at 10,000 rows).
    paused = gc.isenabled()
    gc.disable()
    try:
        return [_message(r) for r in rows]
    finally:
        if paused:
            gc.enable()


def _message(r: sqlite3.Row) -> StoredMessage:
    sent_raw = r["sent_parts"]
    sent = _StoredParts(r["role"], sent_raw, r["id"]) if sent_raw else None
    return StoredMessage(
        r["id"],
        r["conversation_id"],
        r["parent_id"],
        r["turn_id"],
        r["kind"],
        _StoredParts(r["role"], r["parts"], r["id"]),
        sent,
        stored_time(r["created"]),
        _message_meta(r["meta"]),
        r["author"],
    )


def _message_meta(raw: str | None) -> dict[str, Any]:
    """A message's meta; a damaged one (not JSON, or JSON that is not an object) is read as
    none, so the message still shows: every reader calls `.get` on it."""
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def turn_from_row(r: sqlite3.Row) -> Turn:
    """A `turns` row (any query selecting its columns) as a Turn record."""
    return Turn(
        r["id"],
        r["conversation_id"],
        r["run_id"],
        r["user_message_id"],
        r["status"],
        r["stop_reason"],
        r["provider"],
        r["model"],
        Usage(
            r["input_tokens"], r["output_tokens"], r["cache_read_tokens"], r["cache_write_tokens"]
        ),
        r["model_calls"],
        r["tool_calls"],
        r["system_fingerprint"],
        r["error"],
        r["started"],
        r["ended"],
        bool(r["usage_unknown"]),
        r["kind"],
    )
