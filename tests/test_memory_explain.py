"""`heron memory explain PATH` finds the requests that carried an entry in the trace as it is
stored now (requests by reference to content-addressed blobs), for both wires: the system
prompt as a blob of its own (Anthropic-shaped, the scripted provider) and as the first message
of the chain (OpenAI, against the fake server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply


@pytest.fixture(autouse=True)
def no_embeddings(monkeypatch):
    monkeypatch.setenv("HERON_EMBEDDINGS", "0")


def _hand_written(rel: str, text: str) -> None:
    file = Path(os.environ["HERON_HOME"]) / "memory" / rel
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text + "\n")


def _explain(rel: str) -> str:
    result = CliRunner().invoke(app, ["memory", "explain", rel])
    assert result.exit_code == 0, result.output
    return result.output


def _turns(provider: object | None, *texts: str) -> list[str]:
    async def run() -> list[str]:
        async with Engine.open(Settings.load(), provider=provider) as engine:  # type: ignore[arg-type]
            return [(await engine.turn("tea-chat", t)).run_id for t in texts]

    return asyncio.run(run())


def test_explain_lists_the_requests_that_carried_the_entry_and_none_for_one_never_sent():
    _hand_written("personal/always/tea.md", "I drink green tea in the morning.")
    replies = [Reply([Text("Noted.")], "done"), Reply([Text("Sure.")], "done")]
    runs = _turns(ScriptedProvider(replies), "Hello", "What should I drink?")
    shown = _explain("personal/always/tea.md")
    assert "origin:       hand" in shown
    assert "none recorded" not in shown
    for run_id in runs:
        assert f"tea-chat  {run_id}  call 1 (turn)" in shown
    _hand_written("personal/always/later.md", "Written after every request was sent.")
    assert "none recorded" in _explain("personal/always/later.md")


def test_explain_finds_the_entry_in_an_openai_request_whose_system_is_the_first_message(
    monkeypatch,
):
    _hand_written("personal/when/travel/window-seat.md", "I always book a window seat.")
    with FakeOpenAIServer([ServerReply(text="Booked.")]) as server:
        monkeypatch.setenv("HERON_BASE_URL", server.base_url)
        monkeypatch.setenv("HERON_MODEL", "fake-model")
        (run_id,) = _turns(None, "Book me a flight to Lisbon")
    assert "window-seat.md" in str(server.requests[0]["messages"][0])  # the system message
    assert f"tea-chat  {run_id}  call 1 (turn)" in _explain("personal/when/travel/window-seat.md")
