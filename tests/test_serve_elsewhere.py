"""A turn another process runs on the serve's home (`heron run --model` beside it): the serve
learns of it from its lease and tells its clients as it tells them of its own turns: every tab
lists the conversation as running, the conversation's clients hear where it runs, and once it
ends, what it stored, once. Its own turns are never taken for another process's."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from io import StringIO
from typing import Any

import pytest
from rich.console import Console
from serve_helpers import (
    ServeProcess,
    clean_env,
    log_in,
    running_serve,
    ws_client,
    ws_hello,
    ws_next,
)
from test_e2e_cli import openai_env
from websockets.asyncio.client import connect

from heron.agent import leases
from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import InboundMessage, MessageBus
from heron.channels.remote import connect_remote, serve_socket
from heron.channels.terminal import PERSONAL, ChatState, TerminalView
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest, OnEvent
from heron.serve.auth import COOKIE
from heron.serve.elsewhere import Watcher, program_of
from heron.store import engine_state as es
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

WAIT = 30.0


class Gated(ScriptedProvider):
    """Answers `reply` once the test opens the gate: the turn runs until then."""

    def __init__(self, reply: str) -> None:
        super().__init__(lambda request: Reply([Text(reply)], "done", Usage(5, 1)))
        self.gate, self.asked = asyncio.Event(), asyncio.Event()

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        self.asked.set()
        await self.gate.wait()
        return await super().chat(request, on_event)


def _answers(text: str) -> ScriptedProvider:
    return ScriptedProvider(lambda request: Reply([Text(text)], "done", Usage(5, 1)))


async def _until(ws: Any, test: Any) -> list[dict[str, Any]]:
    """Every event (the hub's `running` status included) up to the first that passes `test`."""
    seen = []
    while True:
        event = await ws_next(ws, hub=True)
        seen.append(event)
        if test(event):
            return seen


def _elsewhere(running: bool) -> Any:
    return lambda e: e["type"] == "elsewhere" and e["running"] is running


def _lists(key: str, running: bool) -> Any:
    return lambda e: (
        e["type"] == "status" and e["state"] == "running" and ((key in e["running"]) is running)
    )


@pytest.fixture
def watchers(monkeypatch: pytest.MonkeyPatch) -> list[Watcher]:
    """The serve's watcher, once it is made (the test reads how often it looked)."""
    made, kept = Watcher.__init__, []

    def keep(self: Watcher, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        kept.append(self)

    monkeypatch.setattr(Watcher, "__init__", keep)
    return kept


async def test_a_turn_in_another_process_is_told_to_every_client_and_its_rows_once_it_ends(
    watchers: list[Watcher],
):
    screen = StringIO()
    view = TerminalView(
        Console(file=screen, width=100, color_system=None), ChatState(PERSONAL, "default")
    )
    async with (
        running_serve(_answers("the serve's answer"), services=[]) as running,
        ws_client(running) as tab,
        ws_client(running) as other_tab,
    ):
        await ws_hello(tab, PERSONAL)
        await ws_hello(other_tab, "another")  # another conversation: its list only
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", view.deliver, PERSONAL) as chat:
            provider = Gated("the other process's answer")
            async with Engine.open(Settings.load(), provider=provider) as other:
                loop = AgentLoop(other, MessageBus())
                await loop.dispatch(InboundMessage("script", "c", "slow one", PERSONAL))
                await asyncio.wait_for(provider.asked.wait(), WAIT)
                started = (await _until(tab, _elsewhere(True)))[-1]
                assert (started["pid"], started["where"]) == (os.getpid(), f"process {os.getpid()}")
                await _until(tab, _lists(PERSONAL, True))  # the list says a turn is running
                await _until(other_tab, _lists(PERSONAL, True))  # in every tab
                async with ws_client(running) as late:  # a tab opened now: its welcome says so
                    welcome = await ws_hello(late, PERSONAL)
                    assert welcome["elsewhere"]["pid"] == os.getpid()
                    assert PERSONAL in welcome["running"]
                late_screen = StringIO()  # and a chat opened now
                late_view = TerminalView(
                    Console(file=late_screen, width=100, color_system=None),
                    ChatState(PERSONAL, "default"),
                )
                async with connect_remote(path, "terminal", late_view.deliver, PERSONAL):
                    pass
                provider.gate.set()
                await asyncio.wait_for(loop.wait_idle(), WAIT)
                ended = (await _until(tab, _elsewhere(False)))[-1]
                told = {"text": "slow one", "reply": "the other process's answer"}
                assert ended["turns"] == [{**told, "status": "done", "error": None}]
                await _until(tab, _lists(PERSONAL, False))
                await _until(other_tab, _lists(PERSONAL, False))
                (watcher,) = watchers
                polls = watcher.polls
                while watcher.polls < polls + 2:  # it reads on, and tells nothing more of it
                    await asyncio.sleep(0.05)
                # The serve's own turn is its own: no `elsewhere` for it.
                await tab.send(json.dumps({"type": "send", "text": "and you?"}))
                own = await _until(tab, lambda e: e["type"] == "turn_end")
                await chat.wait_ended(1)
    assert [e for e in own if e["type"] == "elsewhere"] == []
    shown = screen.getvalue()
    said = f"A turn runs in process {os.getpid()}: its reply shows here when it ends."
    assert said in shown and said in late_screen.getvalue()
    assert shown.count("slow one") == shown.count("the other process's answer") == 1
    assert shown.index(f"process {os.getpid()} › slow one") < shown.index("the other process's")
    assert shown.index("the other process's") < shown.index("web › and you?")


async def test_a_turn_of_the_serve_that_waited_for_it_comes_after_its_end():
    """A message sent from the tab while the other process's turn runs waits for it ("busy");
    the other turn's end (its rows) is told before that message's reply, never after."""
    async with (
        running_serve(_answers("the serve's answer"), services=[]) as running,
        ws_client(running) as tab,
    ):
        await ws_hello(tab, PERSONAL)
        provider = Gated("the other process's answer")
        async with Engine.open(Settings.load(), provider=provider) as other:
            loop = AgentLoop(other, MessageBus())
            await loop.dispatch(InboundMessage("script", "c", "slow one", PERSONAL))
            await _until(tab, _elsewhere(True))
            await tab.send(json.dumps({"type": "send", "text": "meanwhile"}))
            busy = await _until(tab, lambda e: e["type"] == "message" and e["kind"] == "notice")
            assert "busy in another session" in busy[-1]["text"]
            provider.gate.set()
            seen = await _until(tab, lambda e: e["type"] == "turn_end")
            await asyncio.wait_for(loop.wait_idle(), WAIT)
    kinds = [e["type"] for e in seen]
    assert kinds.count("elsewhere") == 1 and kinds.index("elsewhere") < kinds.index("turn_end")
    (ended,) = [e for e in seen if e["type"] == "elsewhere"]
    assert [t["text"] for t in ended["turns"]] == ["slow one"]
    assert seen[-1]["reply"] == "the serve's answer"


async def test_the_leases_and_the_turns_the_watcher_reads():
    """What the serve's watcher reads of the store (also run on PostgreSQL, test_engine_pg):
    a running turn's lease with its conversation's key, known to its own process as its own;
    once it ended, no lease, and the turn it stored, its message and its reply."""
    provider = Gated("answered")
    async with Engine.open(Settings.load(), provider=provider) as engine:
        store, loop = engine.store, AgentLoop(engine, MessageBus())
        await loop.dispatch(InboundMessage("script", "c", "first", "k"))
        await asyncio.wait_for(provider.asked.wait(), WAIT)
        (held,) = es.live_leases(store)
        assert (held.key, held.holder.pid) == ("k", os.getpid())
        assert held.conversation_id == store.conversation("k").id
        assert leases.held_here(store) == {held.holder.owner}
        provider.gate.set()
        await asyncio.wait_for(loop.wait_idle(), WAIT)
        assert es.live_leases(store) == [] and leases.held_here(store) == frozenset()
        told = es.turns_since(store, "k", held.acquired)
        later = es.turns_since(store, "k", held.acquired, until=held.acquired)
        unknown = es.turns_since(store, "never", 0.0)
    assert told == [es.TurnTold("first", "answered", "done", None)]
    assert later == unknown == []


def test_the_program_of_a_process_is_read_from_its_command_line():
    assert program_of(os.getpid()) is None  # pytest, not a heron command
    assert program_of(2**22 + 12345) is None  # no such process


@pytest.mark.slow  # a real serve and a real `heron run --model` beside it, on a fake server
async def test_a_heron_run_with_another_model_beside_a_serve_is_shown_in_the_browser(heron_home):
    resume = threading.Event()
    reply = ServerReply(text="answer from elsewhere", stall_after_events=1, resume=resume)
    with FakeOpenAIServer([reply]) as server:
        env = openai_env(server.base_url)
        with ServeProcess(heron_home, env) as serve:
            url = serve.banner.split()[2]
            token = await log_in(serve.login)
            headers = {"Cookie": f"{COOKIE}={token}"}
            ws_url = url.replace("http://", "ws://") + "/ws"
            async with connect(ws_url, origin=url, additional_headers=headers) as tab:
                await ws_hello(tab, PERSONAL)
                run = await asyncio.create_subprocess_exec(
                    *[sys.executable, "-m", "heron", "run", "-c", PERSONAL],
                    *["--model", "fake-model", "slow one"],
                    env=clean_env(heron_home, env),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                try:
                    started = (await _until(tab, _elsewhere(True)))[-1]
                    resume.set()
                    ended = (await _until(tab, _elsewhere(False)))[-1]
                finally:
                    resume.set()
                    out, err = await asyncio.wait_for(run.communicate(), WAIT)
    assert run.returncode == 0, err.decode()
    assert "answer from elsewhere" in out.decode()
    assert (started["program"], started["where"]) == ("heron run", f"heron run, process {run.pid}")
    assert [(t["text"], t["reply"], t["status"]) for t in ended["turns"]] == [
        ("slow one", "answer from elsewhere", "done")
    ]
