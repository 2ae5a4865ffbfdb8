"""Schema migrations, one module per step, applied in name order and recorded by name.

A schema change is a new module `mNNN_<what>.py` here with a `SQL` string (or an
`apply(conn)` function). Numbers leave room: the core is 001, each later concern takes its own.

One set serves both backends: on PostgreSQL (heron/store/pg.py) a step's `SQL` runs through the
same translation as every statement (types, placeholders); a step that SQLite's dialect cannot
say there (FTS5, triggers, json_extract over old rows) also carries `POSTGRES_SQL`, its
PostgreSQL form. tests/test_store_pg.py applies every step on a real server, so a new step
without a form that runs there fails the suite.

Two refusals keep two Herons from writing one database unawares (docs/engine.md, "Upgrades"):
a database that records a step this code does not have was migrated by a newer Heron, and is
not opened at all; and the steps this code would apply are not applied
while another process may be writing with the schema as it is (`guard`: a running `heron
serve`, heron/store/db.py).
"""

from __future__ import annotations

import importlib
import sqlite3
import time
from collections.abc import Callable
from types import ModuleType

from heron.errors import StoreError
from heron.store.pg import MIGRATION_LOCK
from heron.versions import schema_steps

# Called with the steps about to be applied, before any is: raises to refuse them.
Guard = Callable[[list[str]], None]


def _names() -> list[str]:
    return schema_steps()


def _step(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


# Taken inside the migration's transaction on PostgreSQL, where BEGIN locks nothing (SQLite's
# BEGIN IMMEDIATE does): two workers opening a fresh database (or schema: the lock is the
# schema's own, heron/store/pg.py takes it to create one) apply each step once.
_PG_LOCK = f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK}, hashtext(current_schema()))"


def migrate(
    conn: sqlite3.Connection,
    *,
    postgres: bool = False,
    where: str = "the database",
    guard: Guard | None = None,
) -> list[str]:
    """Apply every step not yet recorded; returns the names applied now. `where` names the
    database in a refusal; `guard` may refuse the steps (see the module docstring).

    Runs under one write lock (BEGIN IMMEDIATE) and re-reads what is applied inside it, so two
    processes opening a fresh database at the same moment do not both apply a step."""
    _create_record(conn, postgres)
    names = _names()
    done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
    _refuse_newer(done, names, where)
    if all(name in done for name in names):
        return []  # the usual case: no step module is imported, which a start-up would pay
    if guard is not None:
        guard([name for name in names if name not in done])
    applied = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        if postgres:
            conn.execute(_PG_LOCK)
        done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
        _refuse_newer(done, names, where)  # a newer Heron may have migrated meanwhile
        for name in names:
            if name in done:
                continue
            _apply(conn, _step(name), postgres)
            conn.execute("INSERT INTO _migrations VALUES (?, ?)", (name, time.time()))
            applied.append(name)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return applied


def _refuse_newer(done: set[str], names: list[str], where: str) -> None:
    """A database migrated by a newer Heron is refused before anything reads or writes it:
    this code would write rows without what the newer schema expects of them, and read its
    rows without knowing what they mean."""
    unknown = sorted(done.difference(names))
    if not unknown:
        return
    raise StoreError(
        f"{where} was migrated by a newer Heron: it has migration {unknown[-1]}, and this "
        f"Heron knows migrations up to {names[-1]}",
        hint="Upgrade Heron to the version that last used this home (or newer) and run this "
        "again; this older Heron does not open that database, so it has changed nothing.",
    )


def _create_record(conn: sqlite3.Connection, postgres: bool) -> None:
    """The table of applied steps. On PostgreSQL under the migration lock: two processes
    running `CREATE TABLE IF NOT EXISTS` at the same moment can both pass the check, and the
    second then fails on a duplicate key of the catalog."""
    create = "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)"
    if not postgres:
        conn.execute(create)
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_PG_LOCK)
        conn.execute(create)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _apply(conn: sqlite3.Connection, step: ModuleType, postgres: bool = False) -> None:
    if postgres and hasattr(step, "POSTGRES_SQL"):  # probe: a migration module's optional parts
        for statement in _split(step.POSTGRES_SQL):
            conn.execute(statement)
    elif hasattr(step, "apply"):  # probe: migration module
        step.apply(conn)
    else:
        for statement in _split(step.SQL):
            conn.execute(statement)


def _split(sql: str) -> list[str]:
    return [s.strip() for s in sql.split(";\n") if s.strip()]


def latest() -> str:
    return _names()[-1]
