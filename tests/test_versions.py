"""Two Herons on one home (qa17f #12) and a config.toml edited under a running serve (#8).

An older Heron refuses a database a newer one migrated; a Heron that would migrate the
database refuses to while a serve (another process, perhaps an older Heron) runs on the home;
a client through a serve that is another Heron, or whose config.toml changed since it
started, says so once (docs/engine.md, "Upgrades"; docs/serve.md, "Terminal clients").
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import tempfile
from io import StringIO
from pathlib import Path

import pytest
from serve_helpers import running_serve
from typer.testing import CliRunner

from heron.channels.script import run_message
from heron.cli import app
from heron.config import Settings
from heron.errors import StoreError
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
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


# ---- clients of a serve that is another Heron, or runs an older config.toml ----------------


def _echo(request) -> Reply:
    return Reply([Text("ok")], "done")


async def _run_through_serve(key: str) -> str:
    out, err = StringIO(), StringIO()
    assert await run_message(Settings.load, "hi", "default", key, None, False, out, err)
    assert out.getvalue().strip() == "ok"  # answered through the serve all the same
    return err.getvalue()


CONFIG = 'model = "first-model"\n[providers.openai]\nbase_url = "http://127.0.0.1:9/v1"\n'


async def test_a_config_edit_under_a_running_serve_is_told_to_its_clients():
    config = _home() / "config.toml"
    config.write_text(CONFIG)
    async with running_serve(ScriptedProvider(_echo)):
        assert await _run_through_serve("c1") == ""  # the file it started with: nothing
        config.write_text(CONFIG.replace("first-model", "second-model"))
        said = await _run_through_serve("c1")
        assert "config.toml changed since heron serve started" in said
        assert "model scripted/scripted" in said  # what it still answers with
        assert "restart heron serve" in said
        shown = await asyncio.to_thread(CliRunner().invoke, app, ["config", "show"])
        assert "second-model" in shown.stdout  # the file, as before
        assert "config.toml changed since heron serve started" in shown.stdout
        config.write_text(CONFIG)  # back as the serve loaded it
        assert await _run_through_serve("c1") == ""


async def test_a_client_says_once_that_the_serve_is_another_heron(monkeypatch):
    from heron import versions
    from heron.channels.remote import connect_remote, serve_socket

    async def nothing(item) -> None:
        return None

    async with running_serve(ScriptedProvider(_echo)):
        assert await _run_through_serve("v1") == ""  # the same Heron: nothing said
        newer = versions.newest_step()[:1] + "999_newer"
        monkeypatch.setattr(versions, "newest_step", lambda: newer)  # this client is newer
        said = await _run_through_serve("v1")
        assert "heron serve runs an older Heron than this command" in said
        assert newer in said and "restart heron serve" in said
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", nothing, "v1") as conn:
            assert len(conn.news()) == 1
            assert conn.news() == []  # a chat says it once, not before every message


def test_serve_news_reads_the_welcome():
    from heron.channels.remote import serve_news
    from heron.versions import file_digest, newest_step

    home = _home()
    (home / "config.toml").write_text(CONFIG)
    same = {"schema": newest_step(), "config_digest": file_digest(home / "config.toml")}
    assert serve_news(same, home) == []
    older = serve_news({}, home)  # a serve from before this check says neither
    assert len(older) == 1 and "too old to say which" in older[0]
    newer = serve_news({**same, "schema": "m999_next"}, home)
    assert len(newer) == 1 and "runs a newer Heron" in newer[0] and "upgrade" in newer[0]
    (home / "config.toml").unlink()
    gone = serve_news({**same, "model": "openai/m"}, home)
    assert len(gone) == 1 and "config.toml changed" in gone[0] and "openai/m" in gone[0]
    assert serve_news({**same, "config_digest": None}, home) == []  # no file then, none now


@pytest.mark.slow  # the real `heron chat` on a terminal, through a real serve
def test_a_chat_through_the_serve_says_once_that_config_toml_changed():
    from serve_helpers import ServeProcess
    from test_chat_screen import ChatScreen
    from test_e2e_cli import openai_env

    from heron.testing.fake_openai import FakeOpenAIServer
    from heron.testing.script import ServerReply

    quiet = "[memory]\nreview_on_close = false\n"  # no review left running at exit
    replies = [ServerReply(text=f"answer {n}") for n in (1, 2, 3)]
    with tempfile.TemporaryDirectory(prefix="heron-") as tmp, FakeOpenAIServer(replies) as server:
        home = Path(tmp)
        (home / "config.toml").write_text(quiet)
        with ServeProcess(home, openai_env(server.base_url)):
            chat = ChatScreen(home, server.base_url)
            chat.type("one\r")
            chat.wait_for(lambda: chat.shows("answer 1"), "the first answer")
            (home / "config.toml").write_text(quiet + "[agent]\nresult_budget = 500\n")
            for n in (2, 3):
                chat.type(f"m{n}\r")
                chat.wait_for(lambda n=n: chat.shows(f"answer {n}"), f"answer {n}")
            text = " ".join(chat.lines())
            chat.leave()
    assert "through heron serve" in text
    assert text.count("config.toml changed since heron serve started") == 1
    assert text.index("answer 1") < text.index("config.toml changed") < text.index("answer 2")


def test_a_run_or_chat_that_bypasses_the_serve_says_its_turns_are_not_seen_there():
    """`--model` and `--ephemeral` run turns in their own process beside a serve (which cannot
    give them): its clients do not see them as they run, so the person is told (QA18h #6)."""
    from heron.channels.remote import beside_serve

    home = _home()
    assert beside_serve(home, "another-model", "message") is None  # no serve: nothing to say
    holder = _serve_holding(home)
    try:
        run = beside_serve(home, "another-model", "message")
        chat = beside_serve(home, None, "chat")
    finally:
        holder.communicate("")
    assert run is not None and f"(pid {holder.pid}, http://127.0.0.1:18999)" in run
    assert "--model runs this message in this process instead" in run
    assert chat is not None and "--ephemeral runs this chat in this process" in chat
    assert beside_serve(home, "another-model", "message") is None  # the serve is gone
