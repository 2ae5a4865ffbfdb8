"""A full or read-only disk (QA17f #3, #4): Heron says what is wrong with the disk, never that
the database is damaged; a message it could not store is said to be lost, with no --retry
offered; `heron run --retry` never answers an answered message again; reading commands read a
home that refuses writes.

The disk is simulated: a write that fails inside a transaction with SQLite's own words, and a
read-only file as SQLite opens one (`mode=ro`), since these tests may run as root, whom neither
permissions nor a full disk stop."""

from __future__ import annotations

import json
import logging
import sqlite3
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import running_serve
from typer.testing import CliRunner

from heron.bus import ALREADY_ANSWERED
from heron.channels.script import run_message, run_once
from heron.cli import app
from heron.config import Settings
from heron.errors import DiskFull, ReadOnlyHome, StoreError
from heron.messages import Message, Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.store import disk as disk_mod
from heron.store import engine_state as es

FULL = "database or disk is full"


def _echo(request) -> Reply:
    return Reply([Text("echo")], "done", Usage(10, 2))


def _failing(words: str):
    """A store method that fails inside its transaction as SQLite does on such a disk."""

    def fail(self: Store, *args: Any, **kwargs: Any) -> Any:
        with self.transaction():
            raise sqlite3.OperationalError(words)

    return fail


# ---- telling the disk's refusals apart --------------------------------------------------------


def test_a_full_disk_and_a_read_only_one_are_not_damage(tmp_path, monkeypatch):
    db = tmp_path / "heron.db"
    assert isinstance(disk_mod.refusal(sqlite3.OperationalError(FULL), db), DiskFull)
    readonly = sqlite3.OperationalError("attempt to write a readonly database")
    assert isinstance(disk_mod.refusal(readonly, db), ReadOnlyHome)
    io_error = sqlite3.OperationalError("disk I/O error")
    assert disk_mod.refusal(io_error, db) is None  # space left: not a full disk
    monkeypatch.setattr(disk_mod, "free_bytes", lambda path: 4096)
    full = disk_mod.refusal(io_error, db)  # the -shm file could not grow: full
    assert isinstance(full, DiskFull) and "(4 kB free)" in str(full)
    malformed = sqlite3.DatabaseError("database disk image is malformed")
    assert disk_mod.refusal(malformed, db) is None and disk_mod.damaged(malformed)
    assert not disk_mod.damaged(sqlite3.OperationalError(FULL))


def test_a_real_sqlite_error_is_told_by_its_code(tmp_path):
    db = tmp_path / "ro.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.commit()
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as raised:
        conn.execute("INSERT INTO t VALUES (1)")
    assert disk_mod.primary_code(raised.value) == disk_mod.SQLITE_READONLY
    assert isinstance(disk_mod.refusal(raised.value, db), ReadOnlyHome)


def test_a_full_disk_at_open_says_so_and_never_to_move_the_database_aside(tmp_path, monkeypatch):
    path = tmp_path / "heron.db"
    Store(path).close()
    import heron.store.db as db_mod

    real_migrate = db_mod.migrate
    calls = []

    def migrate(conn, **kw):
        calls.append(1)
        if len(calls) in (1, 2):  # opening to write (twice): the -shm file cannot grow
            raise sqlite3.OperationalError(FULL)
        return real_migrate(conn, **kw)

    monkeypatch.setattr(db_mod, "migrate", migrate)
    with pytest.raises(DiskFull) as raised:
        Store(path)
    said = str(raised.value)
    assert "is full" in said and "Free space" in said
    assert "move it aside" not in said
    # A command that only reads opens it anyway, read-only, and knows why.
    reading = Store(path, reading=True)
    assert isinstance(reading.read_only, DiskFull)
    assert reading.conversations(5) == []


def test_damage_still_gets_the_advice_to_move_the_file_aside(tmp_path):
    path = tmp_path / "heron.db"
    path.write_bytes(b"this is not a database, just text" * 100)
    with pytest.raises(StoreError) as raised:
        Store(path)
    assert "move it aside" in str(raised.value)


def test_a_failed_commit_leaves_no_transaction_open_for_the_next_write(tmp_path):
    store = Store(tmp_path / "heron.db")
    with pytest.raises(DiskFull), store.transaction() as c:
        c.execute(
            "INSERT INTO conversations (key, agent, created, updated) VALUES ('a', 'd', 0, 0)"
        )
        raise sqlite3.OperationalError(FULL)
    assert not store.conn.in_transaction
    store.open_conversation("b")  # its own transaction, committed
    assert [c.key for c in Store(tmp_path / "heron.db").conversations(5)] == []  # none said
    assert store.conversation("a") is None and store.conversation("b") is not None


# ---- a message that could not be stored -------------------------------------------------------


async def test_a_message_the_full_disk_refused_is_said_lost_with_no_retry(caplog):
    await run_once(
        Settings.load(), "first", "default", "full", None, False, StringIO(), StringIO(),
        ScriptedProvider(_echo),
    )  # fmt: skip
    out, err = StringIO(), StringIO()
    with pytest.MonkeyPatch.context() as full, caplog.at_level(logging.ERROR):
        full.setattr(Store, "begin_turn", _failing(FULL))
        full.setattr(es, "release_lease", _failing(FULL))  # the disk refuses that too
        ok = await run_once(
            Settings.load(), "important note", "default", "full", None, False, out, err,
            ScriptedProvider(_echo), as_json=True,
        )  # fmt: skip
    got = json.loads(out.getvalue())
    assert ok is False and got["ok"] is False
    assert "is full" in got["error"] and "Free space" in got["error"]
    assert "not saved" in got["hint"] and "--retry" not in got["hint"]
    assert "Traceback" not in err.getvalue() and not caplog.records
    store = Store(Settings.load().paths.db)
    said = [m.message.text for m in store.branch(store.conversation("full").id)]
    assert not any("important note" in text for text in said)


async def test_the_same_is_said_through_a_serve(monkeypatch):
    async with running_serve(ScriptedProvider(_echo)):
        monkeypatch.setattr(Store, "begin_turn", _failing(FULL))
        out, err = StringIO(), StringIO()
        ok = await run_message(
            Settings.load, "hello", "default", "sfull", None, False, out, err, as_json=True
        )
        plain_out, plain_err = StringIO(), StringIO()
        await run_message(
            Settings.load, "hello", "default", "sfull", None, False, plain_out, plain_err
        )
    got = json.loads(out.getvalue())
    assert ok is False and "is full" in got["error"]
    assert "not saved" in got["hint"] and "--retry" not in got["hint"]
    assert "not saved" in plain_err.getvalue() and "--retry" not in plain_err.getvalue()


# ---- --retry never answers an answered message again ------------------------------------------


def _tool_then_answer(request) -> Reply:
    if not request.messages[-1].tool_results:
        return Reply([ToolCall("c1", "write_file", {"path": "n.txt", "content": "x"})], "tool_use")
    return Reply([Text("written")], "done", Usage(10, 2))


async def test_run_retry_refuses_a_message_that_has_its_answer():
    provider = ScriptedProvider(_tool_then_answer)
    await run_once(
        Settings.load(), "write it", "default", "done", None, False, StringIO(), StringIO(),
        provider,
    )  # fmt: skip
    calls = len(provider.requests)
    out = StringIO()
    ok = await run_once(
        Settings.load(), "/retry unanswered", "default", "done", None, False, out, StringIO(),
        provider, as_json=True,
    )  # fmt: skip
    got = json.loads(out.getvalue())
    assert ok is False and got["error"] == ALREADY_ANSWERED
    assert "`/retry` in `heron chat -c done`" in got["hint"]  # a refusal says what to do
    assert len(provider.requests) == calls  # the turn (and its tool) did not run again
    store = Store(Settings.load().paths.db)
    rows = store.branch(store.conversation("done").id)
    assert [r.role for r in rows] == ["user", "assistant", "user", "assistant"]


def test_the_cli_and_the_fast_path_send_the_refusing_retry(heron_home: Path) -> None:
    from heron.cli import _retry_text
    from heron.entry import parse_run

    store = Store(heron_home / "heron.db")
    store.open_conversation("k")
    store.close()
    assert _retry_text(None, "k") == "/retry unanswered"
    parsed = parse_run(["--retry", "--conversation", "k"])
    assert parsed is not None and parsed["message"] == "/retry unanswered"


# ---- a read-only home -------------------------------------------------------------------------


class _ReadOnlyFolder(sqlite3.Connection):
    """A connection to a WAL database in a read-only folder, as SQLite makes one: every
    statement fails, since the -shm file cannot be created there."""

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("unable to open database file")


@pytest.fixture
def read_only_home(monkeypatch, heron_home: Path) -> Path:
    """A home with one conversation, then on a read-only mount (simulated: see the module)."""
    store = Store(heron_home / "heron.db")
    conv = store.open_conversation("kept")
    store.append(conv.id, Message("user", [Text("the zebra codeword is aquamarine")]))
    store.append(conv.id, Message("assistant", [Text("noted")]))
    store.close()
    import heron.store.db as db_mod

    real = sqlite3.connect

    def connect(database, *args, **kwargs):
        if kwargs.get("uri"):  # read-only or immutable: what a read-only mount allows
            return real(database, *args, **kwargs)
        return real(database, *args, factory=_ReadOnlyFolder, **kwargs)

    monkeypatch.setattr(db_mod.sqlite3, "connect", connect)
    monkeypatch.setattr(disk_mod, "read_only", lambda path: True)
    return heron_home


@pytest.mark.parametrize(
    ("args", "shows"),
    [
        (["conversations", "list"], "kept"),
        (["conversations", "show", "kept"], "aquamarine"),
        (["conversations", "search", "zebra"], "aquamarine"),
        (["conversations", "export", "kept"], "aquamarine"),
        (["memory", "recall", "zebra"], "aquamarine"),
    ],
)
def test_reading_commands_read_a_read_only_home(read_only_home, args, shows):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert shows in result.stdout
    assert "Traceback" not in result.output and "move it aside" not in result.output


@pytest.mark.parametrize(
    "args", [["conversations", "delete", "kept", "-y"], ["run", "-c", "kept", "hello"]]
)
def test_a_writing_command_says_the_home_is_read_only(read_only_home, args):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "is read-only" in result.output and "Make it writable" in result.output
    assert "Traceback" not in result.output and "move it aside" not in result.output


def test_a_write_to_a_read_only_database_file_says_so(tmp_path):
    path = tmp_path / "heron.db"
    Store(path).open_conversation("kept")
    store = Store(path)
    store.conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None)
    with pytest.raises(ReadOnlyHome) as raised:
        store.open_conversation("new")
    assert "read-only" in str(raised.value) and "move it aside" not in str(raised.value)


async def test_a_chat_is_told_the_message_was_not_saved(monkeypatch):
    """`heron chat` and the browser show the loop's error message: it says the message is lost
    (they offer no --retry, but the person must know to send it again)."""
    from heron.agent.engine import Engine
    from heron.bus import OutboundMessage
    from heron.channels.inprocess import connect

    said: list[str] = []

    async def deliver(item) -> None:
        if isinstance(item, OutboundMessage) and item.kind == "error":
            said.append(item.text)

    monkeypatch.setattr(Store, "begin_turn", _failing(FULL))
    opened = Engine.open(Settings.load(), provider=ScriptedProvider(_echo))
    async with opened as engine, connect(engine, "cli", "t", deliver, idle=False) as conn:
        await conn.send("hello", "chatfull", "default")
        await conn.settle()
    assert len(said) == 1 and "is full" in said[0]
    assert "Your message was not saved" in said[0]
