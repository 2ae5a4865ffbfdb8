"""`heron store copy`: a home used on SQLite, copied into PostgreSQL and then opened there through
HERON_DATABASE_URL, reads and continues as it did (docs/scale.md, "Moving a home").

The home is filled the way a person fills it (turns with tool calls and usage, a branch, a
compaction whose summary points at rows, jobs, memory review items, work state) and every
table the engine left empty gets a row of its own, so that every table of the schema is
shown to be copied, or named in EXCLUDED with its reason: a table a later migration adds
fails `test_every_table_of_the_home_is_copied_whole_or_excluded_with_a_reason` until a row of
it is added to FILL below."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
from compaction_helpers import Model, reachable
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.cli import app
from heron.compaction import compact_now
from heron.config import Settings
from heron.errors import StoreError
from heron.memory import queue
from heron.messages import Reply, Text, user
from heron.providers.scripted import ScriptedProvider
from heron.store import Store, jobs, work
from heron.store.copy import EXCLUDED, PRESET, copy_home, excluded
from heron.store.schedule import parse
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

DEAD_PID = 2**22 + 17  # above Linux's default pid_max: no process has it
NOW = time.time()
# A row for each table the engine's turns leave empty in `_filled_home`, so every table is
# seen to be copied. A table a later migration adds goes here when no command fills it.
FILL = {
    "checkpoints": "INSERT INTO checkpoints VALUES (2, 1, 0, '[]', '[]', {now})",
    "context_state": "INSERT INTO context_state VALUES (1, 0, NULL, 0, {now})",
    "goals": "INSERT INTO goals (conversation_key, objective, status, max_turns, max_tokens,"
    " created, updated) VALUES ('k', 'finish the saffron report', 'done', 5, 1000, {now},"
    " {now})",
    "held_messages": "INSERT INTO held_messages (conversation_key, agent, parts, meta, owner,"
    ' host, pid, created) VALUES (\'k\', \'default\', \'[{{"kind": "text", "text": "and'
    " blue\"}}]', NULL, 'gone', 'h', {dead}, {now})",
    "job_runs": "INSERT INTO job_runs (job_id, due, started, ended, status, outcome)"
    " VALUES ((SELECT MIN(id) FROM jobs WHERE mode != 'review'), {now}, {now}, {now},"
    " 'done', 'ok')",
    "memory_cursors": "INSERT INTO memory_cursors VALUES (1, 3, 0)",
    "memory_revocations": "INSERT INTO memory_revocations (quote_key, path, conversation_id,"
    " message_id, created) VALUES ('saffron', 'p.md', 1, 1, {now})",
    "message_marks": "INSERT INTO message_marks VALUES (2, 1, 'compacted')",
    "message_vectors": "INSERT INTO message_vectors VALUES (1, 'm', X'00ff10')",
    "model_calibration": "INSERT INTO model_calibration VALUES ('fake', 1.1, 3, 1, {now})",
    "presence": "INSERT INTO presence VALUES (2, 'gone', 'h', {dead}, 'chat', {now})",
    "review_cursor": "INSERT INTO review_cursor VALUES ('nightly', 5, {now})",
    "runs": "INSERT INTO runs (id, kind, origin_key, lineage, task, status, created)"
    " VALUES ('r1', 'subagent', 'k', 'k/r1', 'look it up', 'done', {now})",
    "ticks": "INSERT INTO ticks (name, last) VALUES ('heartbeat', {now})",
    "todos": "INSERT INTO todos (conversation_id, text, created, updated)"
    " VALUES (1, 'write the saffron report', {now}, {now})",
    "trace_events": "INSERT INTO trace_events (turn_id, after_call, kind, body, at)"
    " VALUES (1, 1, 'mail', 'and also this', {now})",
    "turn_leases": "INSERT INTO turn_leases VALUES (2, 'gone', 'h', {dead}, NULL, 0, 1)",
    "waiting_messages": "INSERT INTO waiting_messages (conversation_key, agent, text, who,"
    " spoken_in, created) VALUES ('other', 'default', 'later', 'monitor', 'cron:1', {now})",
}


async def _filled_home(home: Path) -> None:
    """Conversation `k`: ten turns each with a tool call, a compaction, a turn after it and a
    second branch; `other` with one turn; a scheduled job; a memory review item; work state."""
    (home / "workspace").mkdir(exist_ok=True)
    (home / "workspace" / "notes.txt").write_text("the saffron ledger\n")
    summary = Reply([Text("## Facts\nthe saffron numbers\n## Working state\nW1")], "done")
    model = Model(tool_rounds=1, args={"path": "notes.txt"}, summarize=lambda r: summary)
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        for i in range(10):
            await engine.turn("k", f"note {i}: the saffron number is {1000 + i}")
        conv = engine.store.conversation("k")
        assert conv is not None
        await compact_now(engine, conv, reason="manual")
        await engine.turn("k", "and what comes next?")
        await engine.turn("other", "a second conversation")
        store = engine.store
        rows = store.all_messages(conv.id)
        store.append(conv.id, user("a branch from the start"), parent_id=rows[0].id)
        # the main line goes on from its own last row: a branch beside it, the head on it
        store.append(conv.id, user("back on the main line"), parent_id=rows[-1].id)
        jobs.create_job(
            store, parse(every="1h", timezone="UTC"), conversation="k", prompt="check", now=NOW
        )
        queue.add(store, "fact", origin="review", path="p.md", text="likes saffron",
                  quote="the saffron number", conversation_id=conv.id)  # fmt: skip
        work.set_work_state(store, conv.id, {"goal": "the saffron report"})


def _fill_every_table(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            if excluded(table) or table.startswith("sqlite_"):
                continue
            if conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]:
                continue
            assert table in FILL, f"{table} holds no row in this home: add one to FILL"
            conn.execute(FILL[table].format(now=NOW, dead=DEAD_PID))


def _digest(path: Path) -> str:
    """What the database holds, row by row (its file's bytes change when a connection another
    command left behind closes and checkpoints the WAL into it, the rows do not)."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return hashlib.sha256("\n".join(conn.iterdump()).encode()).hexdigest()
    finally:
        conn.close()


def _shown(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


# What a person reads of the record: printed the same from heron.db and from its copy.
READS = (
    ("conversations", "list"),
    ("conversations", "show", "k"),
    ("usage",),
    ("jobs", "list"),
    ("trace", "ls"),
)


def _reads() -> list[str]:
    return [_shown(*args) for args in READS]


def _pg_counts(url: str) -> dict[str, int]:
    store = Store(url)
    try:
        tables = [r[0] for r in store.query("SELECT tablename FROM pg_tables"
                                            " WHERE schemaname = current_schema()")]  # fmt: skip
        return {t: store.query(f"SELECT COUNT(*) FROM {t}")[0][0] for t in tables}
    finally:
        store.close()


@pytest.mark.pg
def test_a_home_copied_to_postgresql_reads_and_continues_there(heron_home, pg_url, monkeypatch):
    asyncio.run(_filled_home(heron_home))
    _fill_every_table(heron_home / "heron.db")
    before = _reads()
    db = heron_home / "heron.db"
    digest = _digest(db)
    copied = CliRunner().invoke(app, ["store", "copy", "--to", pg_url])
    assert copied.exit_code == 0, copied.output
    assert "each count read back from PostgreSQL" in copied.output
    assert "export HERON_DATABASE_URL=" in copied.output and "heron.db.copied" in copied.output
    assert _digest(db) == digest  # heron.db untouched
    assert not list(heron_home.glob(".heron-copy-*"))  # the snapshot is gone

    monkeypatch.setenv("HERON_DATABASE_URL", pg_url)
    after = _reads()  # the notice that heron.db is unused would be in them
    assert after == before
    assert not (heron_home / "heron.db.unused").exists()  # the notice knows the home was copied
    found = _shown("conversations", "search", "saffron number 1004")
    assert "saffron number is 1004" in found  # PostgreSQL's full-text index holds the rows

    store = Store(pg_url)
    last = store.query("SELECT MAX(id) FROM messages")[0][0]
    conv = store.conversation("k")
    assert conv is not None
    script = [ServerReply(text="The saffron numbers ran from 1000 to 1009.")]
    with FakeOpenAIServer(script) as server:
        monkeypatch.setenv("HERON_BASE_URL", server.base_url)
        monkeypatch.setenv("HERON_API_KEY", "dummy")
        monkeypatch.setenv("HERON_MODEL", "fake-model")
        ran = CliRunner().invoke(app, ["run", "-c", "k", "what were the saffron numbers?"])
        assert ran.exit_code == 0, ran.output
        sent = server.requests[0]
    seen = json.dumps(sent["messages"])
    assert "the saffron numbers" in seen  # the compaction's summary
    assert "back on the main line" in seen and "a branch from the start" not in seen
    assert "and what comes next?" in seen and "what were the saffron numbers?" in seen
    # the summary's pointers name the copied rows: each opens the message it named
    assert reachable(seen, store, conv.id, "note 0: the saffron number is 1000")
    # new rows take ids after the copied ones
    assert store.query("SELECT MIN(id) FROM messages WHERE id > ?", (last,))[0][0] == last + 1
    store.close()


@pytest.mark.pg
def test_every_table_of_the_home_is_copied_whole_or_excluded_with_a_reason(heron_home, pg_url):
    asyncio.run(_filled_home(heron_home))
    db = heron_home / "heron.db"
    _fill_every_table(db)
    copied = copy_home(db, pg_url)
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        source = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}
    left = {t for t in tables if excluded(t) is not None}
    assert set(copied.counts) == tables - left
    assert all(copied.counts[t] == source[t] > 0 for t in copied.counts), copied.counts
    target = _pg_counts(pg_url)
    assert {t: target[t] for t in copied.counts} == copied.counts
    assert set(target) == set(copied.counts) | {"_migrations"}
    assert set(EXCLUDED) == {"_migrations", "messages_fts"}  # each with its reason
    with sqlite3.connect(db) as conn:  # the same rows, ids and all
        ids = [r[0] for r in conn.execute("SELECT id FROM messages ORDER BY id")]
        vector = conn.execute("SELECT vector FROM message_vectors").fetchone()[0]
    store = Store(pg_url)
    assert [r[0] for r in store.query("SELECT id FROM messages ORDER BY id")] == ids
    assert bytes(store.query("SELECT vector FROM message_vectors")[0][0]) == vector
    store.close()


@pytest.mark.pg
def test_a_target_that_holds_a_conversation_or_a_job_is_refused(heron_home, pg_url):
    asyncio.run(_filled_home(heron_home))
    other = Store(pg_url)
    conv = other.open_conversation("theirs")
    other.append(conv.id, user("their own words"))
    result = CliRunner().invoke(app, ["store", "copy", "--to", pg_url])
    assert result.exit_code == 1
    assert "already holds 1 conversation" in result.output and "does not merge" in result.output
    assert "Nothing was copied" in result.output
    assert [c.key for c in other.conversations()] == ["theirs"]
    other.delete_conversation(conv.id)
    jobs.create_job(other, parse(every="1h", timezone="UTC"), conversation="x", prompt="p", now=NOW)
    result = CliRunner().invoke(app, ["store", "copy", "--to", pg_url])
    assert result.exit_code == 1 and "already holds 1 scheduled job" in result.output
    assert other.query("SELECT COUNT(*) FROM messages")[0][0] == 0  # theirs deleted, none copied
    other.close()
    assert not (heron_home / "heron.db.copied").exists()


@pytest.mark.pg
def test_a_copy_cut_midway_or_failing_leaves_the_target_as_it_was(heron_home, pg_url):
    asyncio.run(_filled_home(heron_home))
    db = heron_home / "heron.db"

    def cut(table: str, done: int, total: int) -> None:
        if table == "messages" and done:
            raise KeyboardInterrupt  # Ctrl-C in the middle of a table

    with pytest.raises(KeyboardInterrupt):
        copy_home(db, pg_url, cut)
    empty = {t: 1 if t == "jobs" else 0 for t in _pg_counts(pg_url) if t != "_migrations"}
    assert {t: n for t, n in _pg_counts(pg_url).items() if t != "_migrations"} == empty
    # a row PostgreSQL refuses (text with a NUL) fails the copy, named, and nothing is kept
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE turns SET error = ? WHERE id = 2", ("a\x00b",))
    with pytest.raises(StoreError) as refused:
        copy_home(db, pg_url)
    assert "table turns, row 2" in str(refused.value) and "Nothing was copied" in str(refused.value)
    assert {t: n for t, n in _pg_counts(pg_url).items() if t != "_migrations"} == empty
    assert not list(heron_home.glob(".heron-copy-*"))


def test_a_running_serve_or_an_open_chat_is_refused_before_anything_is_read(heron_home):
    Store(Settings.load().database).close()
    url = "postgresql://heron@127.0.0.1:1/heron"  # never reached: refused before
    lock = os.open(heron_home / "serve.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.write(lock, b"1")  # another process's serve
        with pytest.raises(StoreError, match="heron serve runs on"):
            copy_home(heron_home / "heron.db", url)
    finally:
        os.close(lock)
    (heron_home / "serve.lock").unlink()
    store = Store(Settings.load().database)
    conv = store.open_conversation("k")
    store.close()
    with sqlite3.connect(heron_home / "heron.db") as conn:
        conn.execute(
            "INSERT INTO presence VALUES (?, 'me', ?, ?, 'chat', ?)",
            (conv.id, os.uname().nodename, os.getpid(), time.time() + 60),
        )
    with pytest.raises(StoreError, match=r"is in use: chat in conversation 'k'"):
        copy_home(heron_home / "heron.db", url)
    assert not list(heron_home.glob(".heron-copy-*"))


def test_the_tables_named_as_excluded_or_preset_are_tables_of_the_schema():
    """A name left here after its table was renamed or dropped would exclude nothing."""
    from heron.store.migrations import migrate

    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(conn)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert set(PRESET) <= tables and set(EXCLUDED) <= tables


@pytest.mark.pg
def test_a_target_another_process_is_writing_is_refused_after_a_short_wait(
    heron_home, pg_url, monkeypatch
):
    import psycopg

    from heron.store import copy as copying

    Store(Settings.load().database).close()
    Store(pg_url).close()  # migrated, empty
    monkeypatch.setattr(copying, "LOCK_WAIT_S", 1)
    with psycopg.connect(pg_url) as writer:  # a transaction that writes, left open
        writer.execute("LOCK TABLE conversations IN ROW EXCLUSIVE MODE")
        with pytest.raises(StoreError, match="is in use by another process"):
            copy_home(heron_home / "heron.db", pg_url)
