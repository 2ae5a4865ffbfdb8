"""Recording: every payload rebuilds byte for byte, storage is shared between requests, old rows
still read, and no credential reaches the database or an export."""

from __future__ import annotations

import json

import pytest
from store_faults import fail_first_tool_call_append
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage, dumps
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
from heron.trace.blobs import put_payload, rebuild
from heron.trace.read import list_runs, load_run, request_payload
from heron.trace.render import export_run
from heron.trace.scrub import REDACTED, Scrubber

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")

KEY = "sk-heron-TRACE-7f3a9c1e5b2d4086-unmistakable"


def _script() -> list[Reply]:
    return [
        Reply([ToolCall("c1", "run_cell", {"code": "print(6 * 7)"})], "tool", Usage(100, 10)),
        Reply([Text("It is 42.")], "done", Usage(130, 5, cache_read=100)),
        Reply([Text("Still 42.")], "done", Usage(150, 5, cache_read=130)),
    ]


async def test_every_payload_rebuilds_byte_for_byte_and_prefixes_are_shared():
    provider = ScriptedProvider(_script())
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("r", "what is 6 * 7? use python")
        await engine.turn("r", "and now?")
        store = engine.store
        sent = [dumps(provider.payload(r)) for r in provider.requests]
        runs = list(reversed(list_runs(store, "r")))
        recorded = [
            request_payload(store, c) for run in runs for c in load_run(store, run.run_id).calls
        ]
        empty = store.query("SELECT COUNT(*) FROM model_calls WHERE request != ''")[0][0]
        nodes = store.query("SELECT COUNT(*) FROM trace_nodes")[0][0]
        systems = store.query("SELECT COUNT(*) FROM trace_blobs WHERE kind = 'system'")[0][0]
    assert recorded == sent  # exact bytes, every request
    assert empty == 0  # no full copy of any payload is stored
    # The last request holds 5 messages; the three requests together add no more than that.
    assert len(json.loads(sent[-1])["messages"]) == 5 and nodes == 5
    assert systems == 1


def test_a_non_canonical_payload_is_kept_whole(tmp_path):
    store = Store(tmp_path / "t.db")
    payload = '{"model": "m",  "messages": [{"role": "user", "content": "hi"}]}'
    with store.transaction() as conn:
        ref = put_payload(conn, payload)
        assert rebuild(conn, ref) == payload
    canonical = dumps({"messages": [{"content": "hi", "role": "user"}], "model": "m"})
    with store.transaction() as conn:
        assert rebuild(conn, put_payload(conn, canonical)) == canonical


async def test_rows_written_before_the_trace_schema_still_read():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(_script()[1:2])) as engine:
        await engine.turn("old", "hello")
        store = engine.store
        turn = list_runs(store, "old")[0].turn
        with store.transaction() as c:  # the m001 form: the whole payload in `request`
            c.execute(
                "INSERT INTO model_calls (turn_id, seq, purpose, request, reply, error,"
                " started, ended) VALUES (?, 9, 'turn', ?, NULL, 'x', 1.0, 2.0)",
                (turn.id, '{"legacy":true}'),
            )
        calls = load_run(store, turn.run_id).calls
        payloads = [request_payload(store, c) for c in calls]
    assert payloads[-1] == '{"legacy":true}' and payloads[0].startswith("{")


def test_the_scrubber_replaces_whole_keys_and_ignores_dummies():
    scrub = Scrubber.of([KEY, "short", "not-needed"])
    assert scrub.secrets == (KEY,)
    assert scrub.clean(f"key={KEY}!") == f"key={REDACTED}!"


async def test_no_api_key_in_the_database_or_an_export(heron_home, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    script = [
        ServerReply(tool_calls=[("call_1", "run_cell", {"code": "print(1 + 1)"})]),
        ServerReply(text="Two."),
    ]
    settings = Settings.load()
    with FakeOpenAIServer(script) as server:
        provider = OpenAICompatProvider("gpt-4.1-mini", KEY, server.base_url)
        async with Engine.open(settings, provider=provider) as engine:
            result = await engine.turn("k", "what is 1 + 1?")
            run_id = result.run_id
            export = export_run(engine.store, run_id, Scrubber())  # no scrubbing: nothing to hide
        assert any(KEY in h.get("authorization", "") for h in server.headers)  # it was used
    assert result.text == "Two."
    store = Store(settings.database)
    assert len(load_run(store, run_id).calls) == 2
    if store.backend == "postgresql":  # every row of every table, as text
        tables = store.query(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
        for (table,) in tables:
            found = store.query(
                f"SELECT count(*) FROM {table} t WHERE t::text LIKE ?", (f"%{KEY}%",)
            )
            assert found[0][0] == 0, table
    store.close()  # checkpoints the WAL into the file
    for path in settings.paths.home.rglob("heron.db*"):
        assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in export and json.loads(export)["model_calls"][0]["request"]["messages"]
    cli = CliRunner().invoke(app, ["trace", "export", run_id])
    assert cli.exit_code == 0 and KEY.encode() not in cli.stdout_bytes
    assert json.loads(cli.stdout)["run_id"] == run_id


async def test_a_failed_reply_commit_loses_neither_the_reply_nor_its_call(monkeypatch):
    """A model call's trace row is written in its reply's own transaction (one commit); when
    that transaction fails, the row is written later, whole, and every request still rebuilds."""
    import sqlite3

    provider = ScriptedProvider(_script())
    async with Engine.open(Settings.load(), provider=provider) as engine:
        store = engine.store
        fault = fail_first_tool_call_append(monkeypatch)
        with pytest.raises(sqlite3.OperationalError):  # its reply's commit fails
            await engine.turn("r", "what is 6 * 7? use python")
        fault.restore()
        await engine.turn("r", "and now?")
        turns = store.query("SELECT id FROM turns ORDER BY id")
        calls = store.query("SELECT turn_id, seq FROM model_calls ORDER BY id")
        runs = list(reversed(list_runs(store, "r")))
        recorded = [
            request_payload(store, c) for run in runs for c in load_run(store, run.run_id).calls
        ]
    sent = [dumps(provider.payload(r)) for r in provider.requests]
    assert fault.failed
    assert [(c["turn_id"], c["seq"]) for c in calls] == [(turns[0]["id"], 1), (turns[1]["id"], 1)]
    assert recorded == sent  # the failed turn's call was recorded after all


async def test_trace_show_of_a_continued_reply_shows_every_part():
    """A reply the output cap cut and the run continued twice was shown as its last part
    ("agent: Part three."), though the person read all three."""
    provider = ScriptedProvider(
        [
            Reply([Text("Part one. ")], "length", Usage(5, 1)),
            Reply([Text("Part two. ")], "length", Usage(5, 1)),
            Reply([Text("Part three.")], "done", Usage(5, 1)),
        ]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("len", "essay please")
        run = load_run(engine.store, result.run_id)
    assert run.reply_text == "Part one. Part two. Part three."
    shown = CliRunner().invoke(app, ["trace", "show", result.run_id]).stdout
    assert "agent: Part one. Part two. Part three." in shown


async def test_trace_show_labels_an_opening_heron_wrote_as_heron_s():
    """A reminder's or the heartbeat's opening was printed `you: [Scheduled reminder...]`, the
    one place it was shown as the person's words."""
    from heron.agent.control import TurnControl
    from heron.agent.turn import TurnHooks

    provider = ScriptedProvider([Reply([Text("Stand-up now.")], "done", Usage(5, 1))])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        control = TurnControl("chat-1", provenance="reminder")
        hooks = TurnHooks(control=control)
        result = await engine.turn("chat-1", "[Scheduled reminder, job 3.]\nStand-up", hooks)
    shown = CliRunner().invoke(app, ["trace", "show", result.run_id]).stdout
    assert "heron: [Scheduled reminder, job 3.]" in shown and "you:" not in shown
