"""Two Herons on one home (qa17f #12) and a config.toml edited under a running serve (#8).

An older Heron refuses a database a newer one migrated; a Heron that would migrate the
database refuses to while a serve (another process, perhaps an older Heron) runs on the home;
a client through a serve that is another Heron, or whose config.toml changed since it
started, says so once (docs/engine.md, "Upgrades"; docs/serve.md, "Terminal clients").
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heron.cli import app
from heron.config import Settings
from heron.errors import StoreError
from heron.serve.lock import ServeLock
from heron.store import Store, migrations


def _home() -> Path:
    return Settings.load().paths.ensure().home


def _applied(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return sorted(r[0] for r in conn.execute("SELECT name FROM _migrations"))


def _older_database(db: Path, monkeypatch: pytest.MonkeyPatch, steps: int = 10) -> list[str]:
    """A database as a Heron with only the first `steps` migrations left it."""
    every = migrations._names()
    with monkeypatch.context() as patched:
        patched.setattr(migrations, "_names", lambda: every[:steps])
        Store(db).close()
    assert _applied(db) == every[:steps]
    return every


# ---- (a) an older Heron on a home a newer one migrated ------------------------------------


def _newer_database(db: Path) -> None:
    """A database as a newer Heron leaves it: one migration more than this code has."""
    Store(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO _migrations VALUES ('m999_from_the_future', 0)")


def test_a_database_a_newer_heron_migrated_is_refused_naming_both_migrations():
    db = _home() / "heron.db"
    _newer_database(db)
    before = db.read_bytes()
    with pytest.raises(StoreError) as refused:
        Store(db)
    said = str(refused.value)
    assert "was migrated by a newer Heron" in said and "m999_from_the_future" in said
    assert migrations.latest() in said  # the newest this Heron knows
    assert "Upgrade Heron" in (refused.value.hint or "")
    assert db.read_bytes() == before  # opened, refused, nothing written


def test_an_older_heron_neither_lists_nor_writes_a_newer_home(monkeypatch):
    db = _home() / "heron.db"
    _newer_database(db)
    monkeypatch.setenv("HERON_BASE_URL", "http://127.0.0.1:9/v1")  # never reached
    monkeypatch.setenv("HERON_MODEL", "m")
    for args in (["conversations", "list"], ["run", "-c", "k", "hello"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        assert "was migrated by a newer Heron" in result.stderr, args
        assert "Traceback" not in result.output
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone() == (0,)


# ---- (b) a newer Heron under a running (older) serve -----------------------------------------

HOLD = """
import sys, time
from pathlib import Path
from heron.serve.lock import ServeLock
lock = ServeLock(Path(sys.argv[1]))
lock.acquire()
lock.publish("http://127.0.0.1:18999")
print("held", flush=True)
sys.stdin.read()
"""


def _serve_holding(home: Path) -> subprocess.Popen[str]:
    """Another process holding the home as a running serve does (its lock and serve.json)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_no_migration_while_a_serve_runs_on_the_home(monkeypatch):
    home = _home()
    db = home / "heron.db"
    every = _older_database(db, monkeypatch)
    holder = _serve_holding(home)
    try:
        result = CliRunner().invoke(app, ["conversations", "list"])
        assert result.exit_code == 1, result.output
        said = result.stderr
        assert f"heron serve runs on {home} (pid {holder.pid}, http://127.0.0.1:18999)" in said
        assert "with an older Heron" in said and every[-1] in said
        assert "restart heron serve with this Heron" in said and "Traceback" not in said
        assert _applied(db) == every[:10]  # the serve's schema is left as it knows it
    finally:
        holder.communicate("")
    assert CliRunner().invoke(app, ["conversations", "list"]).exit_code == 0  # serve gone
    assert _applied(db) == every


def test_the_serve_itself_migrates_the_home_it_holds(monkeypatch):
    home = _home()
    every = _older_database(home / "heron.db", monkeypatch)
    with ServeLock(home):  # what `heron serve` does as it starts: lock, then open the engine
        Store(home / "heron.db").close()
    assert _applied(home / "heron.db") == every


def test_an_up_to_date_database_opens_while_a_serve_runs():
    home = _home()
    Store(home / "heron.db").close()
    holder = _serve_holding(home)
    try:
        assert CliRunner().invoke(app, ["conversations", "list"]).exit_code == 0
    finally:
        holder.communicate("")
