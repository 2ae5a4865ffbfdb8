"""PostgreSQL behind the store's own interface: a connection that speaks like sqlite3's.

The store modules write SQLite's dialect (`?` placeholders, `cur.lastrowid`, rows read by name
or index, `BEGIN IMMEDIATE`); rather than write each statement twice, `PgConnection` takes
that dialect and translates it once per distinct statement (cached): placeholders to `%s`,
`INSERT OR IGNORE` to `ON CONFLICT DO NOTHING`, `RETURNING id` added to an INSERT into a table
with an integer id so `lastrowid` works, and the DDL's types (`INTEGER PRIMARY KEY` to an
identity column, `REAL` to double precision). The connection is in autocommit mode, as the
SQLite one is (`isolation_level=None`): the store's `transaction()` says BEGIN and COMMIT.

What is not translated raises at the statement, naming it: docs/scale.md lists what does not
run on PostgreSQL yet.

A connection the server dropped (a restart, an upgrade, a network cut) is opened again at the
next statement (`PgConnection._trip`). A transaction's first round trip, which carries its
BEGIN, and a read outside any transaction are sent again on the new connection, since nothing
of them can have been committed; a transaction cut off after that fails with StoreUnreachable
(nothing of it is saved: its caller rolls back and may try again), and so does a COMMIT or a
write outside a transaction whose outcome is unknown, saying so. While the server cannot be
reached, each statement fails at once with StoreUnreachable, and a new connection is tried
after a back-off (`FIRST_WAIT_S` doubling to `MAX_WAIT_S`): the store's calls run on the event
loop, which must not spin on a server that is down.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from heron.errors import StoreError, StoreUnreachable
from heron.store.pg_url import (
    UNENCODED_HINT,
    needs_encoding,
    redact,
    redact_message,
    split_query,
)

_LEADING_COMMENTS = re.compile(r"^(?:\s*--[^\n]*\n)+")
_OR_REPLACE = re.compile(r"^\s*INSERT\s+OR\s+REPLACE\s+INTO\s+(\w+)\s*\(([^)]*)\)", re.I)
# Each table's primary key, in order: the conflict target of `INSERT OR REPLACE`.
_KEYS = """SELECT tc.table_name, kcu.column_name FROM information_schema.table_constraints tc
   JOIN information_schema.key_column_usage kcu
     ON kcu.constraint_name = tc.constraint_name AND kcu.table_schema = tc.table_schema
   WHERE tc.table_schema = current_schema() AND tc.constraint_type = 'PRIMARY KEY'
   ORDER BY tc.table_name, kcu.ordinal_position"""
_INSERT_INTO = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)", re.I)
# The tables whose rows have an `id` column (the INSERTs that get `RETURNING id`).
_ID_TABLES = """SELECT table_name FROM information_schema.columns
   WHERE table_schema = current_schema() AND column_name = 'id'"""
_OR_IGNORE = re.compile(r"^\s*INSERT\s+OR\s+IGNORE\s+INTO", re.I)
# The change counters (sequences, heron/store/migrations/m018_scale.py) PostgreSQL's caches are
# checked against, where SQLite's are checked against `PRAGMA data_version`.
REWRITES = "heron_rewrites"  # stored message rows rewritten: kept branches are void
TRACE_GC = "heron_trace_gc"  # the trace's garbage collected: cached blob and node ids are void
COUNTERS = (REWRITES, TRACE_GC)
_IS_PARAM = re.compile(r"\bIS\s+\?", re.I)
_IS_NOT_PARAM = re.compile(r"\bIS\s+NOT\s+\?", re.I)
# The advisory lock migrations take (heron/store/migrations), keyed by it and the schema.
MIGRATION_LOCK = 1751
_JSON_PATH = re.compile(r"\$(?:\.\w+|\[\d+\])+")
# A statement that only reads: sent again on a new connection when the old one was lost.
_READ_ONLY = re.compile(
    r"^(?:SELECT|WITH)\b(?!.*\b(?:INSERT|UPDATE|DELETE|NEXTVAL)\b)", re.I | re.S
)
CONNECT_TIMEOUT_S = 10  # the first connection of a process
RECONNECT_TIMEOUT_S = 3  # a connection made again, on the caller's thread (often the event loop)
FIRST_WAIT_S = 0.25  # after a failed reconnect, statements fail at once for this long, doubled
MAX_WAIT_S = 5.0  # up to this
_T = TypeVar("_T")


class Row(tuple[Any, ...]):
    """A row read by index (`r[0]`) or by column name (`r["id"]`), as sqlite3.Row is."""

    names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row.names = names
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self.names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self.names)


class PgCursor:
    """What sqlite3's cursor gives the store: the rows (read at once: the psycopg cursor
    behind them is the connection's one, used again by the next statement), `rowcount`, and
    `lastrowid` for an INSERT given `RETURNING id` (whose row is not a row of the statement's,
    as on SQLite)."""

    __slots__ = ("_at", "_names", "_rows", "lastrowid", "rowcount")

    def __init__(
        self,
        rows: list[Any],
        names: dict[str, int],
        rowcount: int = -1,
        lastrowid: int | None = None,
    ) -> None:
        self._rows = rows
        self._names = names
        self._at = 0
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    def fetchone(self) -> Row | None:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return Row(self._rows[self._at - 1], self._names)

    def fetchall(self) -> list[Row]:
        names, rows = self._names, self._rows[self._at :]
        self._at = len(self._rows)
        return [Row(v, names) for v in rows]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.fetchall())


_NO_ROWS = PgCursor([], {})


@dataclass
class _Plan:
    """A statement of the store's as sent to PostgreSQL, worked out once per connection."""

    text: str
    returned_id: bool = False  # `RETURNING id` added: the first value is the cursor's lastrowid
    begins: bool = False  # BEGIN: sent with the transaction's first statement
    reads: bool = False  # only reads: sent again on a new connection when the old one was lost
    ends: bool = False  # COMMIT or ROLLBACK
    creates: bool = False  # CREATE TABLE: the catalog is read again after it
    names: dict[str, int] | None = None  # the result's column names, on first read


class PgConnection:
    """The subset of sqlite3.Connection the store uses, on one psycopg connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self._open(CONNECT_TIMEOUT_S)
        except StoreUnreachable as e:
            raise StoreError(
                e.summary.replace("cannot connect again", "cannot connect"),
                hint="Check that the server runs and the URL ([store] url in config.toml, or "
                "HERON_DATABASE_URL) names its host, port, user and database."
                + (UNENCODED_HINT if needs_encoding(url) else ""),
            ) from e.__cause__
        from psycopg.pq import ExecStatus, TransactionStatus

        self._idle, self._tuples_ok = TransactionStatus.IDLE, ExecStatus.TUPLES_OK
        self._unknown = TransactionStatus.UNKNOWN  # the status of a lost connection
        # A transaction the connection's loss cut off: why, until its ROLLBACK (see `_trip`).
        self._cut: str | None = None
        self._next_try = 0.0  # time.monotonic() before which no reconnect is tried
        self._wait = FIRST_WAIT_S  # the back-off after the next failed reconnect
        self.reconnects = 0  # connections made again after a loss (tests, logs)
        self._plans: dict[str, _Plan] = {}  # by the store's SQL text
        self._begin: str | None = None  # a BEGIN not sent yet: it goes with the next statement
        self._later: list[tuple[str, tuple[Any, ...] | None]] = []  # see `later`
        self.schema = url_schema(url)
        if self.schema is not None:
            self._ensure_schema(self.schema)
        self._id_tables: set[str] = set()
        self._keys: dict[str, list[str]] = {}
        # Read when an INSERT is next planned, not after each CREATE TABLE: a migration creates
        # dozens of tables, and each read of the catalog is two queries on information_schema.
        self._catalog_stale = True
        # Counters to bump with the open transaction's COMMIT, in the same round trip and after
        # it: a worker that reads the new value also sees what was committed (bumped before the
        # commit, a reader could cache the old rows under the new value).
        self.bump_on_commit: set[str] = set()

    def _open(self, timeout: float) -> None:
        """A new psycopg connection (the first, or after the last one was lost), set up as
        the store expects; StoreUnreachable when the server cannot be reached."""
        import psycopg

        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=int(timeout))
        except psycopg.Error as e:
            raise StoreUnreachable(
                f"cannot connect again to the PostgreSQL database {redact(self.url)}: "
                f"{redact_message(str(e), self.url)}".strip()
            ) from e
        # Every Python int as bigint, as SQLite's INTEGER is: psycopg otherwise picks the smallest
        # type that fits, and a recursive CTE seeded with `?` then mismatches its bigint column.
        from psycopg.types.numeric import Int8Dumper

        # Booleans as 0 and 1, as sqlite3 stores them: the columns are integers.
        conn.adapters.register_dumper(int, Int8Dumper)
        conn.adapters.register_dumper(bool, Int8Dumper)
        self._conn = conn
        # Every statement runs on this one cursor: a new one per statement costs more than the
        # statement's own Python (the rows are read at once, see PgCursor).
        self._cur = conn.cursor()

    def _reopen(self) -> None:
        """The lost connection made again, unless a reconnect failed less than the back-off
        ago (then StoreUnreachable at once: the caller is often the event loop)."""
        now = time.monotonic()
        if now < self._next_try:
            raise StoreUnreachable(
                f"the PostgreSQL database {redact(self.url)} cannot be reached (its connection "
                f"was lost); connecting again in {self._next_try - now:.1f} s",
                hint=_AGAIN,
            )
        try:
            self._open(RECONNECT_TIMEOUT_S)
        except StoreUnreachable as e:
            self._next_try = time.monotonic() + self._wait
            self._wait = min(self._wait * 2, MAX_WAIT_S)
            e.hint = _AGAIN
            raise
        self._next_try, self._wait = 0.0, FIRST_WAIT_S
        self.reconnects += 1

    def _trip(self, send: Callable[..., _T], rerun: bool, *args: Any) -> _T:
        """One round trip (`send(*args)`), through a lost connection: made again first when it
        is known lost, and, when the loss shows only now, the round trip sent again on the new
        one if that is safe: it carries the transaction's BEGIN, or `rerun` (a read outside a
        transaction). Otherwise StoreUnreachable says what became of the work."""
        import psycopg

        if self._cut is not None:
            raise StoreUnreachable(self._cut, hint=_AGAIN)
        if self._conn.closed:
            self._reopen()
        began, held = self._begin, list(self._later)
        mid = self._conn.pgconn.transaction_status != self._idle  # the server's, not a BEGIN held
        try:
            return send(*args)
        except psycopg.Error as e:
            if not self._conn.closed:
                raise  # the statement's own error: the connection is fine
            lost = e
        self._begin, self._later = None, []
        if mid:  # the server rolled the transaction back: nothing of it is saved
            self._cut = self._lost(lost, "a transaction was cut off: nothing of it was saved")
            raise StoreUnreachable(self._cut, hint=_AGAIN) from lost
        if began is None and not rerun:
            said = self._lost(lost, "a statement was cut off: it may or may not have run")
            raise StoreUnreachable(said, hint=_AGAIN) from lost
        self._reopen()
        self._begin, self._later = began, held
        try:
            return send(*args)
        except psycopg.Error as e:
            if not self._conn.closed:
                raise
            self._begin, self._later = None, []
            said = self._lost(e, "lost again at once")
            raise StoreUnreachable(said, hint=_AGAIN) from e

    def _lost(self, error: BaseException, what: str) -> str:
        return (
            f"the connection to the PostgreSQL database {redact(self.url)} was lost "
            f"({str(error).strip() or type(error).__name__}); {what}"
        )

    def _ensure_schema(self, schema: str) -> None:
        """Create the schema the URL names if it does not exist yet (a new tenant): under the
        migrations' advisory lock for that schema, so two workers opening it at once create it
        once. The migrations then make its tables."""
        from psycopg import sql

        found = "SELECT 1 FROM pg_namespace WHERE nspname = %s"
        if self._conn.execute(found, (schema,)).fetchone() is not None:
            return
        with self._conn.transaction():
            self._conn.execute(
                f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK}, hashtext(%s))", (schema,)
            )
            create = sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
            self._conn.execute(create)

    def counter(self, sequence: str) -> int:
        """How many times `sequence` (one of COUNTERS) was bumped, by any worker."""
        if sequence not in COUNTERS:
            raise ValueError(f"not a change counter: {sequence}")
        sql = f"SELECT last_value, is_called FROM {sequence}"
        plan = self._plans.get(sql)
        if plan is None:
            plan = self._plans[sql] = self._plan(sql)
        row = self._send(plan, ()).fetchone()
        return int(row[0]) if row is not None and row[1] else 0

    def read_catalog(self) -> None:
        """Which tables have an `id` and each table's primary key, as the server says now.
        Read again before the first INSERT planned after this connection's CREATE TABLE, and by
        the store after migrating:
        another worker may have created the tables while this one waited for the migration
        lock, and a stale catalog breaks `INSERT OR REPLACE` and `lastrowid`."""
        self._plans.clear()  # an upsert's key and `RETURNING id` follow the catalog
        self._catalog_stale = False
        if self._conn.closed:
            self._reopen()
        self._id_tables = {r[0] for r in self._conn.execute(_ID_TABLES).fetchall()}
        self._keys = {}
        for table, column in self._conn.execute(_KEYS).fetchall():
            self._keys.setdefault(table, []).append(column)

    def _upsert(self, text: str) -> str:
        """`INSERT OR REPLACE INTO t (cols) ...` as an upsert on t's primary key: the row with
        that key takes the new values (SQLite deletes and re-inserts it; the same row results
        here, its key unchanged)."""
        found = _OR_REPLACE.match(text)
        if not found or found[1] not in self._keys:
            raise StoreError(f"cannot translate for PostgreSQL: {text[:120]}")
        table, columns = found[1], [c.strip() for c in found[2].split(",")]
        keys = self._keys[table]
        rest = [c for c in columns if c not in keys]
        action = (
            "DO UPDATE SET " + ", ".join(f"{c} = EXCLUDED.{c}" for c in rest)
            if rest
            else "DO NOTHING"
        )
        head = re.sub(r"^\s*INSERT\s+OR\s+REPLACE\s+INTO", "INSERT INTO", text, count=1, flags=re.I)
        return f"{head} ON CONFLICT ({', '.join(keys)}) {action}"

    @property
    def in_transaction(self) -> bool:
        if self._begin is not None or self._cut is not None:
            return True
        # A lost connection's status is UNKNOWN: its transaction, if any, is gone (see `_cut`).
        return self._conn.pgconn.transaction_status not in (self._idle, self._unknown)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> PgCursor:
        plan = self._plans.get(sql)
        if plan is None:
            plan = self._plans[sql] = self._plan(sql)
        if plan.begins:
            # Not sent yet: it goes with the transaction's first statement, in one round trip.
            if self._cut is not None:
                raise StoreUnreachable(self._cut, hint=_AGAIN)
            self._begin = plan.text
            return _NO_ROWS
        if plan.ends:
            self._end(plan.text)
            return _NO_ROWS
        return self._send(plan, params)

    def _plan(self, sql: str) -> _Plan:
        text = translate(sql)
        head = text[:17].upper()
        if head.startswith("BEGIN"):
            return _Plan(text, begins=True)
        if text in ("COMMIT", "ROLLBACK"):
            return _Plan(text, ends=True)
        if self._catalog_stale and text.lstrip()[:6].upper() == "INSERT":
            self.read_catalog()  # only an INSERT's plan depends on the catalog
        if head == "INSERT OR REPLACE":
            text = self._upsert(text)
        into = _INSERT_INTO.match(text)
        returned_id = bool(into and into[1] in self._id_tables and "RETURNING" not in text.upper())
        if returned_id:
            text += " RETURNING id"
        reads = bool(_READ_ONLY.match(text))
        return _Plan(text, returned_id, reads=reads, creates=head.startswith("CREATE TABLE"))

    def later(self, sql: str, params: Sequence[Any] = ()) -> None:
        """A statement of the open transaction whose result nobody reads (a write, a row
        lock): sent in front of the transaction's next statement, or with its COMMIT, in the
        same round trip. The server still runs each on its own and in order (a row lock's wait
        ends before the next statement takes its snapshot); an error in one surfaces at that
        round trip and fails the transaction as it would have. Outside a transaction it runs
        at once."""
        if not self.in_transaction:
            self.execute(sql, params)
            return
        plan = self._plans.get(sql)
        if plan is None:
            plan = self._plans[sql] = self._plan(sql)
        self._later.append((plan.text, tuple(params) if params else None))

    def _send(self, plan: _Plan, params: Sequence[Any]) -> PgCursor:
        """One statement, with the transaction's BEGIN and the statements held for it in front
        (a pipeline: one round trip for all); the rows read at once."""
        return self._trip(self._send_once, plan.reads, plan, tuple(params) if params else None)

    def _send_once(self, plan: _Plan, values: tuple[Any, ...] | None) -> PgCursor:
        cur = self._cur
        if self._begin is not None or self._later:
            with self._conn.pipeline():
                self._queued()
                cur.execute(plan.text, values)
        else:
            cur.execute(plan.text, values)
        if plan.creates:
            self._plans.clear()  # the plans made on the old catalog
            self._catalog_stale = True
        result = cur.pgresult
        if result is None or result.status != self._tuples_ok:
            return PgCursor([], {}, cur.rowcount)
        rows = cur.fetchall()
        if plan.returned_id:
            return PgCursor([], {}, cur.rowcount, rows[0][0] if rows else None)
        names = plan.names
        if names is None or len(names) != result.nfields:
            fields = range(result.nfields)
            names = plan.names = {(result.fname(i) or b"").decode(): i for i in fields}
        return PgCursor(rows, names, cur.rowcount)

    def _queued(self) -> None:
        """Inside a pipeline: the BEGIN not sent yet and the statements held (`later`)."""
        if self._begin is not None:
            self._conn.execute(self._begin)
            self._begin = None
        held, self._later = self._later, []
        for text, values in held:
            self._conn.execute(text, values)

    def _end(self, text: str) -> None:
        """COMMIT or ROLLBACK. Nothing is sent for a transaction that sent nothing, and a
        rollback drops what was held. The counters to bump go right after a COMMIT, in its
        round trip: the server runs the nextvals after the COMMIT (and none if it fails),
        whatever becomes of this process meanwhile."""
        bumps, self.bump_on_commit = sorted(self.bump_on_commit), set()
        if text == "ROLLBACK" and (self._cut is not None or self._conn.closed):
            # The server ended the transaction with the connection: nothing to roll back.
            self._cut, self._begin, self._later = None, None, []
            return
        nextvals = [f"SELECT nextval('{b}')" for b in bumps] if text == "COMMIT" else []
        if text == "COMMIT" and self._cut is not None:
            raise StoreUnreachable(self._cut, hint=_AGAIN)
        self._trip(self._end_once, False, text, nextvals)

    def _end_once(self, text: str, nextvals: list[str]) -> None:
        if text != "COMMIT" or not self._later:
            sent = self._begin is None
            self._begin, self._later = None, []
            if sent or nextvals:  # one simple-protocol query
                self._cur.execute("; ".join(([text] if sent else []) + nextvals))
            return
        try:
            with self._conn.pipeline():
                self._queued()
                for statement in (text, *nextvals):
                    self._conn.execute(statement)
        except BaseException:
            # A held statement failed: the server skipped the COMMIT, and the transaction
            # must not stay open (in error) on this connection.
            if not self._conn.closed and self._conn.pgconn.transaction_status != self._idle:
                self._cur.execute("ROLLBACK")
            raise

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement for each row, as sqlite3's: in one pipeline (one round trip)."""
        text = translate(sql)
        if text[:17].upper() == "INSERT OR REPLACE":
            text = self._upsert(text)
        self._trip(self._many_once, False, text, [tuple(r) for r in rows])

    def _many_once(self, text: str, rows: list[tuple[Any, ...]]) -> None:
        with self._conn.pipeline(), self._conn.cursor() as cur:
            self._queued()
            cur.executemany(text, rows)

    def cursor(self) -> PgConnection:
        """sqlite3's `conn.cursor()` for a statement whose rows are read as plain tuples
        (`row_factory = None`): a Row here is a tuple already, so the connection serves."""
        return self

    @property
    def row_factory(self) -> None:
        return None

    @row_factory.setter
    def row_factory(self, value: object) -> None:
        """Rows are tuples readable by name whatever is set (the store sets None or
        sqlite3.Row)."""

    def executescript(self, sql: str) -> None:
        for statement in (s.strip() for s in sql.split(";\n")):
            if statement:
                self.execute(statement)

    def close(self) -> None:
        self._conn.close()


_AGAIN = (
    "The database server restarted or cannot be reached; Heron connects again at its next "
    "statement once it answers. Try again then."
)


def pg_of(conn: object) -> PgConnection | None:
    """The PostgreSQL connection behind a store's `conn`, None on SQLite: where a statement
    needs one form per backend."""
    return conn if isinstance(conn, PgConnection) else None


def later(conn: Any, sql: str, params: Sequence[Any] = ()) -> None:
    """A statement inside a write transaction whose result is not read: on PostgreSQL sent
    with the transaction's next round trip (`PgConnection.later`), on SQLite run now."""
    pg = pg_of(conn)
    if pg is not None:
        pg.later(sql, params)
    else:
        conn.execute(sql, params)


def row_lock(conn: object) -> str:
    """The clause that keeps the rows a SELECT reads locked until its transaction ends, in the
    dialect of `conn`: on PostgreSQL `FOR NO KEY UPDATE` (another such SELECT, or an UPDATE of
    the row, waits; an insert that only references the row does not); nothing on SQLite, whose
    `BEGIN IMMEDIATE` already holds the database's one write lock. A statement that reads the
    locked row after the wait reads its newest version; other tables read in that same
    statement may be older, so what must be read after the lock goes in a statement of its
    own (heron/store/engine_state.py `lock_conversation`)."""
    return " FOR NO KEY UPDATE" if pg_of(conn) is not None else ""


def json_sql(conn: object, column: str, path: str, *, integer: bool = False) -> str:
    """SQLite's `json_extract(column, path)` in the dialect of `conn`, for a path of keys and
    indexes (`$.messages[0]`). On PostgreSQL the jsonb path operator gives text: `integer`
    casts it to bigint, to compare with an id as SQLite's integer result compares."""
    if pg_of(conn) is None:
        return f"json_extract({column}, '{path}')"
    if not _JSON_PATH.fullmatch(path):
        raise ValueError(f"not a path of keys and indexes: {path}")
    keys = ",".join(k or i for k, i in re.findall(r"\.(\w+)|\[(\d+)\]", path))
    expr = f"({column}::jsonb #>> '{{{keys}}}')"
    return f"{expr}::bigint" if integer else expr


TENANT = re.compile(r"[a-z0-9_]{1,40}")
_SEARCH_PATH = re.compile(r"(?:-c\s*|--)search_path=([^\s]+)")


def tenant_schema(tenant: str) -> str:
    """The schema that holds a tenant's rows (docs/scale.md, "Tenancy")."""
    if not TENANT.fullmatch(tenant):
        raise ValueError(f"not a tenant name: {tenant!r}")
    return f"heron_{tenant}"


def url_schema(url: str) -> str | None:
    """The schema a URL's `options` put first on the search path, if it names one."""
    from urllib.parse import parse_qs

    for options in parse_qs(split_query(url)[1]).get("options", []):
        found = _SEARCH_PATH.search(options)
        if found:
            return found[1].split(",")[0].strip('"')
    return None


def with_schema(url: str, schema: str) -> str:
    """`url` with `schema` as its search path (added to the URL's `options`), so every
    connection made from it, in this process or another, reads and writes that schema."""
    from urllib.parse import parse_qsl, quote, urlencode

    # By hand, not urlunsplit: that drops an empty host's `//` (`postgresql:///heron`, libpq's
    # local form), and what is left is no URL but a file name.
    head, given = split_query(url)
    query = [(k, v) for k, v in parse_qsl(given) if k != "options"]
    options = [v for k, v in parse_qsl(given) if k == "options"]
    query.append(("options", " ".join([*options, f"-csearch_path={schema}"])))
    return f"{head}?{urlencode(query, quote_via=quote)}"


def is_url(target: object) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


@lru_cache(maxsize=4096)
def translate(sql: str) -> str:
    """SQLite's dialect as written in the store, in PostgreSQL's."""
    text = _LEADING_COMMENTS.sub("", sql).strip()  # a migration's statement starts with its why
    upper = text.upper()
    if upper == "BEGIN IMMEDIATE":
        return "BEGIN"
    if upper.startswith("CREATE"):
        text = ddl(text)
    if _OR_IGNORE.match(text):
        text = _OR_IGNORE.sub("INSERT INTO", text, count=1) + " ON CONFLICT DO NOTHING"
    # SQLite's `x IS ?` compares NULL as a value; PostgreSQL says it at length.
    text = _IS_NOT_PARAM.sub("IS DISTINCT FROM ?", _IS_PARAM.sub("IS NOT DISTINCT FROM ?", text))
    return _placeholders(text)


def ddl(text: str) -> str:
    """SQLite's column types as PostgreSQL's: integer keys as identity columns (the store reads
    ids back through RETURNING), integers as 64-bit, REAL as double precision."""
    text = re.sub(
        r"\bINTEGER PRIMARY KEY(?: AUTOINCREMENT)?",
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        text,
    )
    text = re.sub(r"\bINTEGER\b", "BIGINT", text)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", text)


def _placeholders(text: str) -> str:
    """`?` outside quoted literals to `%s`, and a literal `%` doubled (psycopg's format)."""
    out: list[str] = []
    quote: str | None = None
    for ch in text:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "?":
            out.append("%s")
            continue
        if ch == "%":
            out.append("%%")
            continue
        out.append(ch)
    return "".join(out)
