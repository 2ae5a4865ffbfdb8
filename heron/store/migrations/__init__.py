"""Schema migrations, one module per step, applied in name order and recorded by name.

A schema change is a new module `mNNN_<what>.py` here with a `SQL` string (or an
`apply(conn)` function). Numbers leave room: the core is 001, each later concern takes its own.
"""

from __future__ import annotations

import importlib
import pkgutil
import sqlite3
import time
from types import ModuleType


def _steps() -> list[ModuleType]:
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("m"))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply every step not yet recorded; returns the names applied now."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)"
    )
    done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
    applied = []
    for step in _steps():
        name = step.__name__.rsplit(".", 1)[-1]
        if name in done:
            continue
        with conn:
            if hasattr(step, "apply"):
                step.apply(conn)
            else:
                for statement in _split(step.SQL):
                    conn.execute(statement)
            conn.execute("INSERT INTO _migrations VALUES (?, ?)", (name, time.time()))
        applied.append(name)
    return applied


def _split(sql: str) -> list[str]:
    return [s.strip() for s in sql.split(";\n") if s.strip()]


def latest() -> str:
    return _steps()[-1].__name__.rsplit(".", 1)[-1]
