"""Deleting a conversation takes the trace blobs and nodes only it reached; what other
conversations share stays, and their runs still rebuild byte for byte and replay."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.agent.replay import replay
from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.trace.read import list_runs, load_run, request_payload

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")

GONE = "a secret only the deleted conversation holds"


def _session(text: str) -> list[Reply]:
    return [
        Reply([ToolCall("c1", "run_cell", {"code": f"print({text!r})"})], "tool", Usage(10, 1)),
        Reply([Text(f"printed {text}")], "done", Usage(12, 1)),
    ]


def _bodies(store: Store, needle: str) -> int:
    return store.query("SELECT COUNT(*) FROM trace_blobs WHERE body LIKE ?", (f"%{needle}%",))[0][0]


async def test_deleting_a_conversation_collects_its_blobs_and_keeps_shared_ones():
    settings = Settings.load()
    provider = ScriptedProvider(_session(GONE) + _session("kept"))
    async with Engine.open(settings, provider=provider) as engine:
        await engine.turn("gone", GONE)
        await engine.turn("kept", "print kept")
        store = engine.store
        assert _bodies(store, GONE) > 0
        shared = store.query("SELECT COUNT(*) FROM trace_blobs WHERE kind = 'tools'")[0][0]
        nodes_before = store.query("SELECT COUNT(*) FROM trace_nodes")[0][0]
    result = CliRunner().invoke(app, ["conversations", "delete", "gone", "--yes"])
    assert result.exit_code == 0, result.output
    async with Engine.open(settings, provider=ScriptedProvider([])) as engine:
        store = engine.store
        assert _bodies(store, GONE) == 0  # its messages, prompts and replies are gone
        assert store.query("SELECT COUNT(*) FROM trace_nodes")[0][0] < nodes_before
        # The tool specs blob was shared by both conversations' requests: it stays.
        assert store.query("SELECT COUNT(*) FROM trace_blobs WHERE kind = 'tools'")[0][0] == shared
        (run,) = list_runs(store, "kept")
        trace = load_run(store, run.run_id)
        assert trace.start["prompt_inputs"] is not None  # the start's blobs survive too
        assert all("kept" in request_payload(store, c) for c in trace.calls)
        report = await replay(store, run.run_id)
    assert report.identical, report.render()


def test_deleting_a_conversation_that_does_not_exist_says_so_before_asking():
    """It asked "Delete conversation 'nosuch' and its whole history? [y/N]" first, and said
    there was no such conversation only after a yes."""
    result = CliRunner().invoke(app, ["conversations", "delete", "nosuch"], input="y\n")
    assert result.exit_code != 0
    assert "no conversation 'nosuch'" in result.output
    assert "Delete conversation" not in result.output  # never asked
    from heron.channels.info import open_store

    store = open_store(Settings.load())
    store.open_conversation("real")
    store.close()
    asked = CliRunner().invoke(app, ["conversations", "delete", "real"], input="y\n")
    assert asked.exit_code == 0, asked.output
    assert "Delete conversation 'real' and its whole history?" in asked.output
    assert "Deleted conversation 'real'." in asked.output
