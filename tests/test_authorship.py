"""Rows Heron writes itself are Heron's: the runner's continue and wrap-up prompts are stored
with author 'heron', are never quotable as the user's words, are never shown as `you`, and
databases written before the author column get it filled in by the migration."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.agent.runner import CONTINUE, WRAP_UP, RunLimits
from heron.cli import app
from heron.config import Settings
from heron.memory.entries import MemoryRefused
from heron.messages import Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.store.migrations import _apply, _names, _step


@pytest.fixture(autouse=True)
def no_embeddings(monkeypatch):
    monkeypatch.setenv("HERON_EMBEDDINGS", "0")


def _run(provider: ScriptedProvider, key: str, text: str, **limits: int):
    async def go():
        settings = Settings.load()
        async with Engine.open(settings, provider=provider) as engine:
            if limits:
                engine.limits = RunLimits(**limits)
            result = await engine.turn(key, text)
            return result, engine.store, engine.memory

    return asyncio.run(go())


def test_the_continue_prompt_is_heron_s_row_never_quoted_never_shown_as_you():
    provider = ScriptedProvider(
        [Reply([Text("The first half")], "length"), Reply([Text(" and the rest.")], "done")]
    )
    result, _, _ = _run(provider, "cut", "Tell me a long story please")
    assert result.ok
    store = Store(Settings.load().paths.db)
    rows = store.branch(store.conversation("cut").id)
    authors = [(r.role, r.author, r.message.text) for r in rows]
    assert ("user", "heron", CONTINUE) in authors
    assert authors[0] == ("user", "user", "Tell me a long story please")
    assert {a for role, a, _ in authors if role == "assistant"} == {"model"}
    from heron.memory.service import MemoryService

    service = MemoryService(Settings.load().paths.memory, store)
    conv = store.conversation("cut").id
    with pytest.raises(MemoryRefused, match="not in anything the user wrote"):
        service.verify_quote(conv, "Continue exactly where it stopped")
    assert service.verify_quote(conv, "Tell me a long story please").message_id == rows[0].id
    shown = CliRunner().invoke(app, ["conversations", "show", "cut"])
    assert shown.exit_code == 0, shown.output
    assert f"heron: {CONTINUE}" in shown.output
    assert f"you: {CONTINUE}" not in shown.output
    assert "you: Tell me a long story please" in shown.output


def test_the_wrap_up_prompt_is_heron_s_row():
    call = Reply([ToolCall("t1", "list_files", {})], "tool")
    provider = ScriptedProvider([call, Reply([Text("Done so far: listed.")], "done")])
    result, _, _ = _run(provider, "wrap", "List the files forever", max_model_calls=1)
    assert result.run.stop == "wrapup"
    store = Store(Settings.load().paths.db)
    rows = store.branch(store.conversation("wrap").id)
    prompt = WRAP_UP.format(what="1 model calls")
    assert [(r.author, r.message.text) for r in rows if r.author == "heron"] == [("heron", prompt)]
    assert [r.author for r in rows] == ["user", "model", "tool", "heron", "model"]


def test_a_memory_save_quoting_heron_s_prompt_is_refused_through_the_tool():
    save = {
        "action": "create",
        "path": "personal/always/continue",
        "quote": "Continue exactly where it stopped.",
    }
    provider = ScriptedProvider(
        [
            Reply([Text("Part one")], "length"),
            Reply([ToolCall("m1", "manage_memory", save)], "tool"),
            Reply([Text("ok")], "done"),
        ]
    )
    result, _, _ = _run(provider, "q", "Write something long")
    results = [p for m in result.run.messages for p in m.tool_results]
    assert results and results[0].is_error
    assert "not in anything the user wrote" in results[0].content
    assert not list(Settings.load().paths.memory.rglob("*.md"))


def test_the_migration_fills_in_authors_of_rows_written_before_it(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)")
    for name in _names():
        if name < "m007":
            _apply(conn, _step(name))
            conn.execute("INSERT INTO _migrations VALUES (?, 0)", (name,))
    conn.execute("INSERT INTO conversations (key, created, updated) VALUES ('old', 0, 0)")
    rows = [
        ("user", "message", '[{"kind":"text","text":"hello there"}]', None),
        ("assistant", "message", '[{"kind":"text","text":"Hi"}]', None),
        ("user", "message", f'[{{"kind":"text","text":"{CONTINUE}"}}]', None),
        ("user", "message", '[{"kind":"text","text":"' + WRAP_UP.format(what="9 x") + '"}]', None),
        (
            "user",
            "message",
            '[{"call_id":"a","content":"x","is_error":false,"kind":"tool_result"}]',
            None,
        ),
        ("user", "message", '[{"kind":"text","text":"recalled"}]', '{"recall": true}'),
        ("user", "summary", '[{"kind":"text","text":"a summary"}]', None),
        ("assistant", "separator", '[{"kind":"text","text":"--- new ---"}]', None),
        ("assistant", "message", '[{"kind":"text","text":"(stopped)"}]', '{"interrupted": true}'),
    ]
    for role, kind, parts, meta in rows:
        conn.execute(
            "INSERT INTO messages (conversation_id, role, kind, parts, meta, created)"
            " VALUES (1, ?, ?, ?, ?, 0)",
            (role, kind, parts, meta),
        )
    conn.close()
    store = Store(path)  # migrates
    got = [r.author for r in store.all_messages(1)]
    assert got == ["user", "model", "heron", "heron", "tool", "heron", "heron", "heron", "heron"]
