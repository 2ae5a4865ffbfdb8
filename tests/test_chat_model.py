"""`/model` in a chat: it shows the model in use and, in `heron chat` run in its own process,
`/model NAME` switches the model for the turns after it, in the same conversation. Before,
`/model x` and `/models` went to the model as ordinary (paid) messages (QA22u M4)."""

from __future__ import annotations

import asyncio
import io
from typing import Any, ClassVar

import pytest
from rich.console import Console

from heron.agent.engine import Engine
from heron.channels import terminal
from heron.config import Settings
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply


async def test_model_shows_the_model_and_is_never_sent_to_it():
    provider = ScriptedProvider([Reply([Text("never")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        shown = await engine.turn("m", "/model")
        plural = await engine.turn("m", "/models")
        named = await engine.turn("m", "/model gpt-other")
    assert provider.requests == []
    assert shown.reply.startswith("model: scripted/") and "/model NAME switches" in shown.reply
    assert plural.reply == shown.reply
    assert "heron chat --model gpt-other -c m" in named.reply


class _Typing:
    """prompt_toolkit's PromptSession, typing the given lines (shared by every session the
    chat opens), then Ctrl-D."""

    lines: ClassVar[list[str]] = []
    # Ctrl-D waits for this many requests to have reached the server (a person reads the
    # answer before leaving; leaving at once would stop the last turn before it asks).
    server: FakeOpenAIServer | None = None
    requests = 0

    def __init__(self, *args: Any, **kw: Any) -> None:
        pass

    async def prompt_async(self, *args: Any, **kw: Any) -> str:
        if self.lines:
            return self.lines.pop(0)
        for _ in range(500):
            if self.server is None or len(self.server.requests) >= self.requests:
                break
            await asyncio.sleep(0.01)
        raise EOFError


@pytest.fixture
def chat_screen(monkeypatch):
    import prompt_toolkit

    monkeypatch.setattr(prompt_toolkit, "PromptSession", _Typing)
    home = Settings.load().paths.home  # no review at exit: its model calls are not the point
    (home / "config.toml").write_text("[memory]\nreview_on_close = false\n")
    screen = io.StringIO()
    monkeypatch.setattr(terminal, "Console", lambda: Console(file=screen, width=200))
    return screen


async def test_model_name_switches_the_next_turns_in_the_same_conversation(
    chat_screen, monkeypatch
):
    server = FakeOpenAIServer([ServerReply(text="one"), ServerReply(text="two")])
    monkeypatch.setenv("HERON_BASE_URL", server.start())
    monkeypatch.setenv("HERON_MODEL", "fake-model")
    _Typing.lines = ["first", "/model", "/model other-model", "second"]
    _Typing.server, _Typing.requests = server, 2
    try:
        await terminal.run_chat(Settings.load(), "default", "sw", None, ephemeral=False)
    finally:
        server.stop()
    assert [r["model"] for r in server.requests] == ["fake-model", "other-model"], (
        chat_screen.getvalue()
    )
    asked = [m["content"] for m in server.requests[1]["messages"] if m["role"] == "user"]
    assert asked[0].startswith("first")  # the same conversation: the new model reads it
    said = chat_screen.getvalue()
    assert "model: openai/fake-model" in said
    assert "Switching to openai/other-model" in said
    assert "Heron · openai/other-model · conversation sw" in said


async def test_a_model_that_cannot_be_used_is_said_and_the_chat_keeps_its_own(
    chat_screen, monkeypatch
):
    server = FakeOpenAIServer([ServerReply(text="kept")])
    monkeypatch.setenv("HERON_BASE_URL", server.start())
    monkeypatch.setenv("HERON_MODEL", "fake-model")
    _Typing.lines = ["/model /nowhere/model.gguf", "still here"]
    _Typing.server, _Typing.requests = server, 1
    try:
        await terminal.run_chat(Settings.load(), "default", "sw2", None, ephemeral=False)
    finally:
        server.stop()
    said = chat_screen.getvalue()
    assert "no GGUF file at /nowhere/model.gguf" in said
    assert "The model stays openai/fake-model." in said
    assert [r["model"] for r in server.requests] == ["fake-model"]
