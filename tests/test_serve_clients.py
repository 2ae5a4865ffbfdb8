"""`heron run` (and chat's connection) as thin clients of a running serve: the same output as
in-process, busy conversations answered through the mailbox, no provider imported."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from io import StringIO
from typing import Any

import pytest
from rich.console import Console
from serve_helpers import (
    LineClient,
    ServeProcess,
    clean_env,
    running_serve,
    ws_client,
    ws_hello,
    ws_until,
)

from heron.channels.remote import connect_remote, serve_socket
from heron.channels.script import run_message, run_once
from heron.channels.terminal import PERSONAL, ChatState, TerminalView
from heron.config import Settings
from heron.entry import parse_run
from heron.messages import Message, Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.store.records import is_internal
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
from heron.tools.context import ToolContext
from heron.tools.registry import Tool, ToolRegistry, tool


class _Watched(StringIO):
    """stderr that says when a word was written to it."""

    def __init__(self, word: str) -> None:
        super().__init__()
        self.word, self.seen = word, asyncio.Event()

    def write(self, text: str) -> int:
        if self.word in text:
            self.seen.set()
        return super().write(text)


def _gated() -> tuple[asyncio.Event, Tool]:
    """A tool that waits until the test sets the event: what is sent meanwhile is mail."""
    gate = asyncio.Event()

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Wait until the test opens the gate."""
        await gate.wait()
        return "gate passed"

    return gate, wait_gate


def _echo(request) -> Reply:
    said = request.messages[-1].text.partition("[Runtime")[0].strip()
    return Reply([Text(f"echo: {said}")], "done")


async def test_heron_run_through_serve_prints_what_it_prints_in_process():
    through = (StringIO(), StringIO())
    async with running_serve(ScriptedProvider(_echo)) as serve:
        ok = await run_message(Settings.load, "hi there", "default", "k1", None, False, *through)
        served = serve.url
    alone = (StringIO(), StringIO())
    provider = ScriptedProvider(_echo)
    assert await run_once(
        Settings.load(), "hi there", "default", "k2", None, False, *alone, provider
    )
    assert ok and served
    assert through[0].getvalue() == alone[0].getvalue() == "echo: hi there\n"
    assert through[1].getvalue() == alone[1].getvalue()


async def test_heron_run_without_a_key_starts_a_new_thread_each_time_either_way():
    """Seed 001: a script's message is its own thread, never the personal conversation."""
    async with running_serve(ScriptedProvider(_echo)):
        for text in ("one", "two"):
            assert await run_message(
                Settings.load, text, "default", None, None, False, StringIO(), StringIO()
            )
    provider = ScriptedProvider(_echo)
    for text in ("three", "four"):
        assert await run_once(
            Settings.load(), text, "default", None, None, False, StringIO(), StringIO(), provider
        )
    store = Store(Settings.load().paths.db)
    try:
        found = {
            c.key: [m.message.text for m in store.branch(c.id)] for c in store.conversations(10)
        }
    finally:
        store.close()
    assert sorted(said[0] for said in found.values()) == ["four", "one", "three", "two"]
    assert all(key.startswith("run") for key in found) and PERSONAL not in found


async def test_heron_run_on_a_busy_conversation_says_so_and_is_answered_in_the_running_turn():
    gate, wait_gate = _gated()
    seen: list[str] = []

    def script(request) -> Reply:
        said = [m.text for m in request.messages if m.role == "user"]
        seen.append(said[-1])
        if len(seen) == 1:
            return Reply([ToolCall("c1", "wait_gate", {})], "tool")
        return Reply([Text("answered both")], "done")

    out, err = StringIO(), _Watched("busy")
    registry = ToolRegistry([wait_gate])
    async with running_serve(ScriptedProvider(script), registry) as serve, ws_client(serve) as ws:
        await ws_hello(ws)
        await ws.send(json.dumps({"type": "send", "text": "start the job"}))
        await ws_until(ws, "tool_start")
        run = asyncio.create_task(
            run_message(Settings.load, "and this too", "default", "personal", None, False, out, err)
        )
        await asyncio.wait_for(err.seen.wait(), 30)
        assert not run.done()
        gate.set()
        assert await asyncio.wait_for(run, 30)
        browser = await ws_until(ws, "turn_end")
    assert "went to the running turn" in err.getvalue()
    assert out.getvalue() == "answered both\n"
    assert any("and this too" in m for m in seen)  # the mail reached the model in that turn
    assert browser[-1]["reply"] == "answered both"  # the browser saw the same turn end


async def test_heron_run_prints_its_own_commands_answer_never_the_running_turns():
    """QA: `/goal` sent by `heron run` while a turn ran printed that turn's tail and never its
    own answer. /goal is answered at once beside the turn (as /status is); a command that waits
    for the turn (/help) prints its own answer, not the turn it waited for."""
    gate, wait_gate = _gated()

    def script(request) -> Reply:
        if request.messages[-1].role == "user" and "start the job" in request.messages[-1].text:
            return Reply([Text("other turn says hi"), ToolCall("c1", "wait_gate", {})], "tool")
        return Reply([Text("other turn done")], "done")

    registry = ToolRegistry([wait_gate])
    goal, helped = (StringIO(), StringIO()), (StringIO(), StringIO())
    async with running_serve(ScriptedProvider(script), registry) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "busy")
        await ws.send(json.dumps({"type": "send", "text": "start the job"}))
        await ws_until(ws, "tool_start")
        asked = run_message(Settings.load, "/goal", "default", "busy", None, False, *goal)
        assert await asyncio.wait_for(asked, 30)  # while the turn still waits at the gate
        waits = asyncio.create_task(
            run_message(Settings.load, "/help", "default", "busy", None, False, *helped)
        )
        await asyncio.sleep(0.2)
        gate.set()
        assert await asyncio.wait_for(waits, 30)
    assert goal[0].getvalue() == "No goal in this conversation. /goal TEXT sets one.\n"
    assert "other turn" not in helped[0].getvalue()
    assert helped[0].getvalue().startswith("Commands")


@pytest.mark.slow
def test_a_run_through_serve_imports_no_provider_and_no_sdk(heron_home):
    with FakeOpenAIServer([ServerReply(text="light reply")]) as model:
        env = {"HERON_BASE_URL": model.base_url, "HERON_API_KEY": "d", "HERON_MODEL": "fake-model"}
        with ServeProcess(heron_home, env):
            run = subprocess.run(
                [sys.executable, "-X", "importtime", "-m", "heron", "run", "hello"],
                env=clean_env(heron_home, env),
                capture_output=True,
                text=True,
                timeout=120,
            )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "light reply\n"
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)", run.stderr, re.M))
    assert "heron.channels.remote" in imported  # it went through the serve
    heavy = {m for m in imported if m.split(".")[0] in ("openai", "anthropic", "xllamacpp")}
    heavy |= {m for m in imported if m.split(".")[0] in ("typer", "pydantic", "rich")}
    heavy |= {
        m for m in imported if m.startswith(("heron.providers", "heron.agent", "heron.store"))
    }
    assert heavy == set()


async def test_the_terminal_and_the_browser_share_the_personal_conversation_as_it_streams():
    screen = StringIO()
    console = Console(file=screen, width=100, color_system=None)
    state = ChatState(PERSONAL, "default")
    view = TerminalView(console, state)
    async with running_serve(ScriptedProvider(_echo)) as serve, ws_client(serve) as ws:
        await ws_hello(ws, last_seq=None)  # the browser's tab, on `personal` by default
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", view.deliver, PERSONAL) as conn:
            view.chat_id = conn.chat_id or ""
            await conn.send("typed in the terminal", PERSONAL)
            await conn.settle()
            in_browser = await ws_until(ws, "turn_end")
            await ws.send(json.dumps({"type": "send", "text": "typed in the browser"}))
            await ws_until(ws, "turn_end")
            await conn.wait_ended(2)  # the browser's turn reached the terminal too
    start = in_browser[0]
    assert start["type"] == "turn_start" and start["text"] == "typed in the terminal"
    assert start["channel"] == "terminal"
    assert "".join(e["text"] for e in in_browser if e["type"] == "delta") == (
        "echo: typed in the terminal"
    )
    shown = screen.getvalue()
    assert "web › typed in the browser" in shown and "echo: typed in the browser" in shown
    assert "terminal › typed in the terminal" not in shown  # its own message is not echoed


async def test_internal_conversations_are_never_listed():
    keys = ["personal", "cron:daily-news", "heartbeat", "subagent:abc", "cronjob", "Heartbeat"]
    store = Store(Settings.load().paths.ensure().db)
    for key in keys:  # each with something said in it (an empty one is never listed)
        store.append(store.open_conversation(key).id, Message("user", [Text("hi")]))
    listed = {c.key for c in store.conversations()}
    everything = {c.key for c in store.conversations(internal=True)}
    store.close()
    assert listed == {k for k in keys if not is_internal(k)} == {"personal", "cronjob", "Heartbeat"}
    assert everything == set(keys)
    async with running_serve(ScriptedProvider([])) as serve:
        client = await LineClient.open(serve.info.socket)
        await client.send({"type": "conversations"})
        answer = await client.next()
        await client.close()
    assert {i["key"] for i in answer["items"]} == listed  # what /resume offers through serve


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["hello"], {"message": "hello"}),
        (["-"], {"message": "-"}),
        (["--conversation", "k", "hi"], {"message": "hi", "conversation": "k"}),
        (["--conversation=k", "--agent", "work", "hi"], {"conversation": "k", "agent": "work"}),
        (["--retry", "--conversation", "k"], {"message": "/retry unanswered", "retry": True}),
        (["--", "-starts with a dash"], {"message": "-starts with a dash"}),
    ],
)
def test_the_fast_path_reads_the_options_it_knows(args, expected):
    parsed = parse_run(args)
    assert parsed is not None
    assert {k: parsed[k] for k in expected} == expected


@pytest.mark.parametrize(
    "args",
    [
        [],  # no message: the full CLI explains
        ["--help"],
        ["--model", "m", "hi"],
        ["--ephemeral", "hi"],
        ["-c", "k", "hi"],  # short options are the full CLI's to define
        ["-a", "file", "hi"],
        ["--json", "hi"],
        ["one", "two"],
        ["--retry", "hi"],
        ["--conversation"],
    ],
)
def test_anything_else_goes_to_the_full_cli(args):
    assert parse_run(args) is None


async def test_a_stop_through_serve_settles_once_the_turn_it_stopped_ends():
    """/stop's answer ("Stopped...") comes after the stopped turn's end: the chat that sent
    it (Ctrl-C, then Ctrl-D) must not wait for a turn of its own that never comes."""
    from test_terminal_polish import _HalfThenHang

    hanging, seen = _HalfThenHang(), []

    async def deliver(item) -> None:
        seen.append(item)

    async with running_serve(hanging):
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", deliver, "stop-me") as conn:
            await conn.send("tell me", "stop-me")
            await asyncio.wait_for(hanging.streamed.wait(), 30)
            await conn.send("/stop", "stop-me")
            await asyncio.wait_for(conn.settle(), 30)
            assert not conn.running("stop-me")
            said = [m.text for m in seen if getattr(m, "kind", "") == "command"]
            assert said == ["Stopped. What the turn finished is kept."]
            await conn.send("/status", "stop-me")  # the next command is still answered
            await asyncio.wait_for(conn.settle(), 30)


async def test_a_chat_through_serve_shows_the_tool_calls_arguments_in_the_pill_and_in_show():
    @tool
    async def greet(ctx: ToolContext, name: str) -> str:
        """Greet someone."""
        return f"hello {name}"

    def script(request) -> Reply:
        if request.messages[-1].tool_results:
            return Reply([Text("greeted")], "done")
        return Reply([ToolCall("g1", "greet", {"name": "Ada"})], "tool")

    screen = StringIO()
    console = Console(file=screen, width=100, color_system=None)
    state = ChatState(PERSONAL, "default")
    view = TerminalView(console, state)
    async with running_serve(ScriptedProvider(script), ToolRegistry([greet])):
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", view.deliver, PERSONAL) as conn:
            view.chat_id = conn.chat_id or ""
            await conn.send("greet Ada", PERSONAL)
            await conn.settle()
    assert state.results[0].call.args == {"name": "Ada"}  # what /show N prints with the result
    assert 'greet {"name": "Ada"} ✓' in screen.getvalue()


@contextlib.asynccontextmanager
async def _job_started_in_the_terminal(script: list[Reply], gated: Tool) -> AsyncIterator[Any]:
    """A serve with the browser's tab and `heron chat`'s connection on `personal`, once the
    terminal's "start the job" has its tool call running: (the terminal's screen, its
    connection, the tab's socket)."""
    screen = StringIO()
    view = TerminalView(
        Console(file=screen, width=100, color_system=None), ChatState(PERSONAL, "default")
    )
    registry = ToolRegistry([gated])
    async with running_serve(ScriptedProvider(script), registry) as serve, ws_client(serve) as ws:
        await ws_hello(ws, last_seq=None)
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", view.deliver, PERSONAL) as conn:
            view.chat_id = conn.chat_id or ""
            await conn.send("start the job", PERSONAL)
            await ws_until(ws, "tool_start")
            yield screen, conn, ws


async def test_a_message_the_browser_sends_into_the_terminals_turn_is_shown_and_named_web():
    gate, wait_gate = _gated()
    sent: list[str] = []

    def script(request) -> Reply:
        sent.append(request.messages[-1].text)
        if len(sent) == 1:
            return Reply([ToolCall("c1", "wait_gate", {})], "tool")
        return Reply([Text("answered both")], "done")

    async with _job_started_in_the_terminal(script, wait_gate) as (screen, conn, ws):
        await ws.send(json.dumps({"type": "send", "text": "typed in the browser"}))
        mailed = await ws_until(ws, "status")
        assert mailed[-1]["state"] == "mail"
        gate.set()
        await conn.settle()
    shown = screen.getvalue()
    assert "web › typed in the browser" in shown  # as a turn the browser starts is shown
    assert "↳ added to the running turn" not in shown  # that line is for the terminal's own
    assert "[sent while you were working, from web] typed in the browser" in sent[-1]


async def test_a_stop_held_for_its_messages_start_ends_with_a_refused_message():
    """Ctrl-C right after Enter holds its /stop until the turn of the message starts (the
    serve says so once the message is stored); a message the serve refuses (config.toml broke
    since it started) starts none, and the chat must not wait for it."""
    seen: list[object] = []

    async def deliver(item) -> None:
        seen.append(item)

    async with running_serve(ScriptedProvider([])):
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", deliver, "held") as conn:
            Settings.load().paths.config.write_text("[agent\n")
            await conn.send("hello", "held")
            assert conn.running("held")  # sent, not started: Ctrl-C now is a stop
            await conn.send("/stop", "held")
            await asyncio.wait_for(conn.settle(), 30)
            assert not conn.running("held")
    assert conn.refusals and "malformed TOML" in str(conn.refusals[0].get("message"))


async def test_a_turn_the_browser_stops_is_named_so_in_the_terminal_once():
    """The browser's /stop answers the browser ("Stopped."); the terminal whose turn it ended
    says who stopped it, in one line, from the turn's end."""
    _gate, wait_gate = _gated()  # never opened: only the stop ends the turn
    script = [Reply([ToolCall("c1", "wait_gate", {})], "tool")]
    async with _job_started_in_the_terminal(script, wait_gate) as (screen, conn, ws):
        await ws.send(json.dumps({"type": "stop"}))
        answered = await ws_until(ws, "message")  # the browser's own answer
        await conn.settle()
    assert answered[-1]["text"] == "Stopped. What the turn finished is kept."
    assert answered[-1]["code"] == "stop_answer"
    shown = screen.getvalue()
    assert shown.count("Stopped by /stop from the browser. What the turn finished is kept.") == 1
    assert "Stopped. What the turn finished is kept." not in shown


async def test_a_chat_attached_after_the_question_was_asked_shows_its_arguments():
    """A question (ask_user) asked by a turn started before the chat attached: the `tool_end`
    the chat sees is the first it hears of the call, and it names the call's arguments for it
    (the pill showed `ask_user {}`), and for /show N."""

    def script(request) -> Reply:
        if request.messages[-1].tool_results:
            return Reply([Text("booked")], "done")
        return Reply([ToolCall("q1", "ask_user", {"question": "Which city?"})], "tool")

    asked = asyncio.Event()

    async def first(item) -> None:
        if getattr(item, "kind", "") == "question":
            asked.set()

    screen = StringIO()
    state = ChatState("trip", "default")
    view = TerminalView(Console(file=screen, width=100, color_system=None), state)
    async with running_serve(ScriptedProvider(script)):
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", first, "trip") as before:
            await before.send("book a trip", "trip")
            await asyncio.wait_for(asked.wait(), 30)
            async with connect_remote(path, "terminal", view.deliver, "trip") as conn:
                view.chat_id = conn.chat_id or ""
                await conn.send("Lisbon", "trip")
                await asyncio.wait_for(before.settle(), 30)
                await asyncio.wait_for(conn.settle(), 30)
    (pill,) = state.results
    assert pill.call.args == {"question": "Which city?"}  # what /show 1 prints
    assert 'ask_user {"question": "Which city?"} ✓' in screen.getvalue()


async def test_files_the_browser_attaches_are_named_in_the_terminal():
    screen = StringIO()
    console = Console(file=screen, width=100, color_system=None)
    view = TerminalView(console, ChatState(PERSONAL, "default"))
    async with running_serve(ScriptedProvider(_echo)) as serve, ws_client(serve) as ws:
        await ws_hello(ws, last_seq=None)
        async with serve.http() as http:
            made = await http.post(
                "/api/uploads",
                params={"name": "notes.txt"},
                content=b"hello",
                headers={"Content-Type": "text/plain", "Origin": serve.url},
            )
        assert made.status_code == 201, made.text
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", view.deliver, PERSONAL) as conn:
            view.chat_id = conn.chat_id or ""
            upload = made.json()
            sent = {"type": "send", "text": "three files from phone", "files": [upload]}
            await ws.send(json.dumps(sent))
            started = await ws_until(ws, "turn_end")
            await conn.wait_ended(1)
    assert started[0]["files"] == ["notes.txt (5 bytes)"]
    shown = screen.getvalue()
    assert "web › three files from phone" in shown
    assert "attached: notes.txt (5 bytes)" in shown
