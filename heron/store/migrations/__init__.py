"""Schema migrations, one module per step, applied in name order and recorded by name.

A schema change is a new module `mNNN_<what>.py` here with a `SQL` string (or an
`apply(conn)` function). Numbers leave room: the core is 001, each later concern takes its own.

One set serves both backends: on PostgreSQL (heron/store/pg.py) a step's `SQL` runs through the
same translation as every statement (types, placeholders); a step that SQLite's dialect cannot
say there (FTS5, triggers, json_extract over old rows) also carries `POSTGRES_SQL`, its
PostgreSQL form. tests/test_store_pg.py applies every step on a real server, so a new step
without a form that runs there fails the suite.
"""

from __future__ import annotations

import importlib
import pkgutil
import sqlite3
import time
from types import ModuleType

from heron.store.pg import MIGRATION_LOCK


def _names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("m"))


def _step(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


# Taken inside the migration's transaction on PostgreSQL, where BEGIN locks nothing (SQLite's
# BEGIN IMMEDIATE does): two workers opening a fresh database (or schema: the lock is the
# schema's own, heron/store/pg.py takes it to create one) apply each step once.
_PG_LOCK = f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK}, hashtext(current_schema()))"


def migrate(conn: sqlite3.Connection, *, postgres: bool = False) -> list[str]:
    """Apply every step not yet recorded; returns the names applied now.

    Runs under one write lock (BEGIN IMMEDIATE) and re-reads what is applied inside it, so two
    processes opening a fresh database at the same moment do not both apply a step."""
    _create_record(conn, postgres)
    names = _names()
    done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
    if all(name in done for name in names):
        return []  # the usual case: no step module is imported, which a start-up would pay
    applied = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        if postgres:
            conn.execute(_PG_LOCK)
        done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
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
