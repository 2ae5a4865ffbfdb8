"""A home's heron.db copied into a PostgreSQL schema: `heron store copy` (docs/scale.md,
"Moving a home").

What is copied is read from the schema, not listed here: every table of the SQLite database but
those `EXCLUDED` names, each with its reason, so a table a later migration adds is copied with
no change here (tests/test_store_copy.py fails on a table that holds no row in its home, so a
new table's copy is seen to work). Rows keep their ids: pointers (`[#N]`), traces, memory
provenance and jobs name rows by id. Each identity column's sequence is then set past the
copied ids; PostgreSQL's full-text index (`messages.body_tsv`, generated) is computed from
each row as it is written.

The source is a snapshot: heron.db copied with SQLite's backup API into a folder of the home
and migrated there to this Heron's steps (heron.db itself is only read). It is refused while
a `heron serve`, a turn or an open chat runs on the home: what they wrote after the snapshot
would be left behind. The target is migrated first (a fresh schema, as any first use makes
it), then filled in one transaction that first locks its tables and checks that it holds
nothing of anyone's: an error, a Ctrl-C or a lost connection leaves it as it was.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heron.errors import StoreError
from heron.messages import plural
from heron.store.engine_state import claim_dead
from heron.store.home_lock import other_serve
from heron.store.migrations import migrate
from heron.store.pg import url_schema
from heron.store.pg_url import redact, split_query

if TYPE_CHECKING:
    import psycopg

# Tables of heron.db that are not copied, and why. Every other table is.
EXCLUDED: dict[str, str] = {
    "_migrations": "the target records the steps its own migration applied: the same ones, "
    "as the snapshot is migrated to this Heron's steps before it is read",
    "messages_fts": "SQLite's full-text index (FTS5, with its shadow tables messages_fts_*); "
    "PostgreSQL's is the column messages.body_tsv, computed from each copied row",
}
# Rows a schema holds before anyone used it, replaced by the home's: the built-in review job
# its migration inserts (m010), and what a serve writes while idle.
PRESET: dict[str, str] = {"jobs": "mode = 'review'", "ticks": "TRUE", "review_cursor": "TRUE"}
LOCK_WAIT_S = 10  # how long the copy waits for another process to let go of the target's tables
BATCH = 1000  # rows read from the snapshot at a time, and between two progress reports

Progress = Callable[[str, int, int], None]  # table, rows copied so far, rows it holds


@dataclass(frozen=True)
class Copied:
    """What a copy did: the database it wrote (its URL without the password), the schema,
    the rows of each table (read back from the target and equal to the source's) and the
    newest message id it carried."""

    target: str
    schema: str
    counts: dict[str, int]
    last_message: int
    at: float

    @property
    def where(self) -> str:
        return where(self.target)


def excluded(table: str) -> str | None:
    """Why `table` is not copied; None when it is."""
    if table.startswith("messages_fts"):
        return EXCLUDED["messages_fts"]
    return EXCLUDED.get(table)


def copy_home(db: Path, url: str, progress: Progress | None = None) -> Copied:
    """Copy the record in `db` (a home's heron.db) into the PostgreSQL schema `url` names
    (its search path), which must hold nothing of anyone's yet. Raises StoreError saying why
    nothing was copied."""
    if not db.exists():
        raise StoreError(
            f"there is no {db} to copy",
            hint="Point HERON_HOME at the home whose heron.db you want to move.",
        )
    serve = other_serve(db.parent)
    if serve is not None:
        raise StoreError(
            f"heron serve runs on {db.parent} ({serve}): what it writes after the copy would "
            "not be in it",
            hint="Stop heron serve (Ctrl-C in its terminal), run this again, then start it "
            "with the database URL set. Nothing was copied.",
        )
    with snapshot(db) as source:
        _refuse_live(source, db)
        _migrate_target(url)
        return _copy(source, url, progress or (lambda table, done, total: None))


@contextmanager
def snapshot(db: Path) -> Iterator[sqlite3.Connection]:
    """A consistent copy of `db` (SQLite's backup API: whatever another process commits
    meanwhile is in it whole or not at all), migrated to this Heron's steps; kept in a
    private folder beside it and deleted after."""
    folder = Path(tempfile.mkdtemp(prefix=".heron-copy-", dir=db.parent))
    try:
        path = folder / "heron.db"
        source = _connect(f"{db.absolute().as_uri()}?mode=ro", db)
        target = sqlite3.connect(path)
        try:
            source.backup(target)
        except sqlite3.Error as e:
            raise StoreError(
                f"cannot make a snapshot of {db} in {folder}: {e}",
                hint="It needs as much free space as heron.db takes; free some and run this "
                "again. Nothing was copied.",
            ) from e
        finally:
            source.close()
            target.close()
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys=ON")
            migrate(conn, where=f"the database {db}")
            yield conn
        finally:
            conn.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _connect(uri: str, db: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise StoreError(
            f"cannot read {db}: {e}", hint="Check that it is this home's heron.db."
        ) from e
    return conn


def _refuse_live(source: sqlite3.Connection, db: Path) -> None:
    """Refuses while a process runs a turn or has a chat open on the home (a lease or a
    presence row whose process lives): it would go on writing heron.db after the copy."""
    now = time.time()
    rows = source.execute(
        "SELECT c.key, l.host, l.pid, l.expires, 'a turn' FROM turn_leases l"
        " JOIN conversations c ON c.id = l.conversation_id UNION ALL"
        " SELECT c.key, p.host, p.pid, p.expires, p.what FROM presence p"
        " JOIN conversations c ON c.id = p.conversation_id"
    ).fetchall()
    live = [r for r in rows if not claim_dead(r[1], r[2], r[3], now)]
    if not live:
        return
    who = "; ".join(f"{r[4]} in conversation {r[0]!r} (process {r[2]} on {r[1]})" for r in live)
    raise StoreError(
        f"{db} is in use: {who}; what it writes after the copy would not be in it",
        hint="Let the turn end, or leave the chat (Ctrl-D), then run this again. Nothing was "
        "copied.",
    )


def _migrate_target(url: str) -> None:
    """The target's schema made and migrated as the store does on first use."""
    from heron.store.db import Store

    Store(url).close()


def _copy(source: sqlite3.Connection, url: str, progress: Progress) -> Copied:
    import psycopg

    tables = [t for t in _source_tables(source) if excluded(t) is None]
    try:
        with psycopg.connect(url) as pg, pg.transaction():
            columns = _target_columns(pg)
            order = _in_reference_order(pg, tables, columns, url)
            _lock_and_check_empty(pg, order, url)
            counts = {}
            for table in order:
                names = _columns(source, table, columns[table], url)
                counts[table] = _copy_table(source, pg, table, names, progress)
            _move_identities(pg, order)
            _verify(pg, counts)
        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute("ANALYZE")  # plans for the tables as they now are, not as empty ones
    except psycopg.Error as e:
        raise StoreError(
            f"the copy into {where(url)} failed: {str(e).strip()}",
            hint="Nothing was copied: the target is as it was, and heron.db is untouched. "
            "Fix what the error names and run this again.",
        ) from e
    last = source.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0]
    schema = url_schema(url) or "public"
    return Copied(redact(url), schema, counts, int(last), time.time())


def _source_tables(source: sqlite3.Connection) -> list[str]:
    rows = source.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        " ORDER BY name"
    )
    return [r[0] for r in rows]


def _target_columns(pg: psycopg.Connection[Any]) -> dict[str, set[str]]:
    """Each table of the target schema, with the columns a row is written with (a generated
    column is computed by the server)."""
    rows = pg.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND is_generated = 'NEVER'"
    ).fetchall()
    found: dict[str, set[str]] = {}
    for table, column in rows:
        found.setdefault(table, set()).add(column)
    return found


def _in_reference_order(
    pg: psycopg.Connection[Any], tables: list[str], columns: dict[str, set[str]], url: str
) -> list[str]:
    """`tables` ordered so that each comes after those its foreign keys name (PostgreSQL
    checks each row as it is written). A table's references to itself (a message's parent)
    are met by copying its rows in id order: a parent is always older."""
    missing = [t for t in tables if t not in columns]
    if missing:
        raise StoreError(
            f"{where(url)} has no table {', '.join(missing)} of heron.db after its migration",
            hint="This Heron's migrations do not make them on PostgreSQL: a defect of Heron; "
            "nothing was copied.",
        )
    graph: dict[str, set[str]] = {t: set() for t in tables}
    for table, names in pg.execute(
        "SELECT c.relname, p.relname FROM pg_constraint k"
        " JOIN pg_class c ON c.oid = k.conrelid JOIN pg_class p ON p.oid = k.confrelid"
        " WHERE k.contype = 'f' AND k.connamespace = current_schema()::regnamespace"
    ).fetchall():
        if table in graph and names in graph and names != table:
            graph[table].add(names)
    try:
        return list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        raise StoreError(f"the tables' foreign keys form a cycle: {e.args[1]}") from e


def _lock_and_check_empty(pg: psycopg.Connection[Any], tables: list[str], url: str) -> None:
    """The target's tables locked against writers until the copy commits, then refused if
    they hold anything of anyone's: there is nothing to merge two records by. A schema's
    preset rows (`PRESET`) are deleted, to be replaced by the home's."""
    import psycopg
    from psycopg import sql

    names = sql.SQL(", ").join(sql.Identifier(t) for t in tables)
    pg.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT_S}s'")
    try:
        pg.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(names))
    except psycopg.errors.LockNotAvailable as e:
        raise StoreError(
            f"{where(url)} is in use by another process (it held its tables for {LOCK_WAIT_S} s)",
            hint="Stop the Heron processes using that database (heron serve, heron worker) "
            "and run this again. Nothing was copied.",
        ) from e
    held = {}
    for table in tables:
        theirs = f"NOT ({PRESET[table]})" if table in PRESET else "TRUE"
        query = sql.SQL("SELECT COUNT(*) FROM {} WHERE " + theirs).format(sql.Identifier(table))
        row = pg.execute(query).fetchone()
        if row is not None and row[0]:
            held[table] = int(row[0])
    if held:
        raise StoreError(_held_text(held, url), hint=_HELD_HINT.format(schema=url_schema(url)))
    for table, preset in PRESET.items():
        if table in tables:
            pg.execute(sql.SQL("DELETE FROM {} WHERE " + preset).format(sql.Identifier(table)))


def _held_text(held: dict[str, int], url: str) -> str:
    """What the target holds, as a refusal: its conversations and jobs, else the tables an
    earlier use left rows in."""
    said = [
        plural(held[table], what)
        for table, what in (("conversations", "conversation"), ("jobs", "scheduled job"))
        if table in held
    ]
    if not said:
        said = ["rows of an earlier use: " + ", ".join(f"{t} ({n})" for t, n in held.items())]
    return (
        f"{where(url)} already holds {' and '.join(said)}: heron store copy moves a home into "
        "an empty schema, it does not merge two records"
    )


def where(url: str) -> str:
    """The target as a person reads it: the URL without its password or options, and the
    schema its options name."""
    from urllib.parse import parse_qsl, urlencode

    head, given = split_query(url)  # not urlunsplit: it drops `postgresql:///db`'s `//`
    query = urlencode([(k, v) for k, v in parse_qsl(given) if k != "options"])
    plain = redact(f"{head}?{query}" if query else head)
    return f"{plain}, schema {url_schema(url) or 'public'}"


_HELD_HINT = (
    "Nothing was copied. Copy into another schema ([store] tenant in config.toml names it), "
    "or, when what {schema} holds is not wanted, drop it (DROP SCHEMA {schema} CASCADE) and "
    "run this again."
)


def _columns(source: sqlite3.Connection, table: str, target: set[str], url: str) -> list[str]:
    """The columns of `table` to copy: all of the source's, each of which the target must
    have (the same migrations made both)."""
    names = [r[1] for r in source.execute(f"PRAGMA table_info({table})")]
    missing = [n for n in names if n not in target]
    if missing:
        raise StoreError(
            f"{where(url)}: table {table} has no column {', '.join(missing)} after its "
            "migration, which heron.db's has",
            hint="A defect of Heron's migrations on PostgreSQL; nothing was copied.",
        )
    return names


def _copy_table(
    source: sqlite3.Connection,
    pg: psycopg.Connection[Any],
    table: str,
    names: Sequence[str],
    progress: Progress,
) -> int:
    """Every row of `table`, in id order, through COPY (one stream, not a statement a row)."""
    from psycopg import sql

    total = source.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    progress(table, 0, total)
    rows = source.execute(f"SELECT rowid, {', '.join(names)} FROM {table} ORDER BY rowid")
    columns = sql.SQL(", ").join(sql.Identifier(n) for n in names)
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(table), columns)
    done = 0
    with pg.cursor() as cur, cur.copy(statement) as stream:
        while batch := rows.fetchmany(BATCH):
            for row in batch:
                _write_row(stream, table, row)
            done += len(batch)
            progress(table, done, total)
    return done


def _write_row(stream: psycopg.Copy, table: str, row: Sequence[Any]) -> None:
    """One row (its rowid first, not written) into the COPY stream; a value PostgreSQL cannot
    hold (a NUL character in text) is named with its table and rowid."""
    import psycopg

    try:
        stream.write_row(row[1:])
    except psycopg.Error as e:
        raise psycopg.DataError(f"table {table}, row {row[0]}: {e}") from e


def _move_identities(pg: psycopg.Connection[Any], tables: list[str]) -> None:
    """Each identity column's sequence set past the highest id copied: the next row the
    store inserts takes the next id, as it would have on SQLite."""
    from psycopg import sql

    rows = pg.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND is_identity = 'YES'"
    ).fetchall()
    for table, column in rows:
        if table not in tables:
            continue
        pg.execute(
            sql.SQL(
                "SELECT setval(pg_get_serial_sequence(%s, %s), m) FROM"
                " (SELECT MAX({}) AS m FROM {}) x WHERE m IS NOT NULL"
            ).format(sql.Identifier(column), sql.Identifier(table)),
            (table, column),
        )


def _verify(pg: psycopg.Connection[Any], counts: dict[str, int]) -> None:
    """Each table's rows counted again on the target, inside the copy's transaction: a
    difference rolls everything back."""
    from psycopg import sql

    for table, copied in counts.items():
        row = pg.execute(sql.SQL("SELECT COUNT(*) FROM {}").format(sql.Identifier(table)))
        found = row.fetchone()
        held = int(found[0]) if found is not None else -1
        if held != copied:
            raise StoreError(
                f"table {table}: {copied} rows copied but {held} found in the target",
                hint="Nothing was copied (rolled back). This is a defect of Heron: report it.",
            )
