"""`heron serve`: /ws with a real uvicorn on 127.0.0.1 and a scripted model, the numbered
journal (fan-out, resume from last_seq, gaps), /stop mid-tool, the /ws Origin check, the lock
(the login: tests/test_serve_auth.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import stat
from io import StringIO
from pathlib import Path

import pytest
from serve_helpers import LineClient, running_serve, ws_client, ws_hello, ws_next, ws_until
from websockets.exceptions import ConnectionClosed, InvalidStatus

from heron.bus import TurnEnd, TurnEvent
from heron.channels.script import run_remote
from heron.config import Settings
from heron.errors import ConfigError
from heron.messages import Reply, Text, ToolCall, ToolResult, Usage
from heron.providers.profiles import ModelProfile
from heron.providers.scripted import ScriptedProvider
from heron.serve.hub import CLIENT_QUEUE, Client, Hub
from heron.serve.lock import INFO_NAME, SOCKET_NAME, ServeLock, read_info
from heron.store import Store
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool
from heron.versions import newest_step


def _gated() -> tuple[ToolRegistry, asyncio.Event]:
    gate = asyncio.Event()

    @tool
    async def quick(ctx: ToolContext) -> str:
        """Finish at once."""
        return "quick done"

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Wait until the test opens the gate."""
        await gate.wait()
        return "gate passed"

    return ToolRegistry([quick, wait_gate]), gate


def _echo(request) -> Reply:
    said = request.messages[-1].text.partition("[Runtime")[0].strip()
    return Reply([Text(f"echo: {said}")], "done")


async def test_a_message_streams_as_numbered_events_to_the_client_that_sent_it():
    async with running_serve(ScriptedProvider(_echo)) as serve, ws_client(serve) as ws:
        welcome = await ws_hello(ws)
        assert welcome == {
            "type": "welcome",
            "conversation": "personal",
            "seq": 0,
            "busy": False,
            "title": None,
            "chat_id": welcome["chat_id"],
            "model": "scripted/scripted",
            "embedded": False,
            "model_name": "scripted",  # what a client's HERON_MODEL, HERON_CONTEXT_WINDOW and
            "window": 128_000,  # HERON_BASE_URL are compared with (remote.serve_differs)
            "profile": dataclasses.asdict(ModelProfile()),  # a client's budget view uses it
            "model_file": None,  # a local GGUF's profile as read from the file
            "base_url": None,
            "schema": newest_step(),  # which Heron, which config.toml: remote.serve_news
            "config_digest": None,  # no config.toml in this home
            "running": [],
            "waiting": [],
            "instance": welcome["instance"],  # this process's numbering (test_serve_restart)
        }
        assert re.fullmatch(r"[0-9a-f]{16}", welcome["instance"])
        await ws.send(json.dumps({"type": "send", "text": "hello there"}))
        events = await ws_until(ws, "turn_end")
    kinds = [e["type"] for e in events]
    assert kinds[0] == "turn_start" and kinds[-1] == "turn_end" and "delta" in kinds
    assert events[0]["text"] == "hello there" and events[0]["channel"] == "web"
    assert events[0]["chat_id"] == welcome["chat_id"]  # a client knows its own messages
    assert "".join(e["text"] for e in events if e["type"] == "delta") == "echo: hello there"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {e["conversation"] for e in events} == {"personal"}
    end = events[-1]
    assert end["outcome"] == "delivered" and end["interrupted"] is False
    assert set(end["usage"]) == {"input", "output", "cache_read", "cache_write"}


async def test_two_clients_see_the_same_events_and_a_reconnect_resumes_exactly():
    async with running_serve(ScriptedProvider(_echo)) as serve:
        async with ws_client(serve) as a, ws_client(serve) as b:
            await ws_hello(a)
            await ws_hello(b)
            await a.send(json.dumps({"type": "send", "text": "one"}))
            seen_a = await ws_until(a, "idle")
            seen_b = await ws_until(b, "idle")
            assert seen_a == seen_b
        middle = seen_a[len(seen_a) // 2]["seq"]
        async with ws_client(serve) as c:  # a tab reloaded: it saw up to `middle`
            welcome = await ws_hello(c, last_seq=middle)
            assert welcome["seq"] == seen_a[-1]["seq"] and "gap" not in welcome
            resumed = [await ws_next(c) for _ in range(len(seen_a) - middle)]
            await c.send(json.dumps({"type": "send", "text": "two"}))
            after = await ws_next(c)
    assert resumed == seen_a[middle:]  # nothing lost, nothing repeated
    assert after["type"] == "turn_start" and after["seq"] == seen_a[-1]["seq"] + 1


async def test_stop_mid_tool_ends_the_turn_and_keeps_the_finished_tool_work():
    registry, _gate = _gated()  # the gate stays shut: only /stop ends the turn
    script = [
        Reply([Text("Step one."), ToolCall("c1", "quick", {})], "tool"),
        Reply([ToolCall("c2", "wait_gate", {})], "tool"),
    ]
    async with running_serve(ScriptedProvider(script), registry) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "job")
        await ws.send(json.dumps({"type": "send", "text": "do the job"}))
        started = []
        while len(started) < 2:
            event = await ws_next(ws)
            if event["type"] == "tool_start":
                started.append(event)
        await ws.send(json.dumps({"type": "stop"}))
        events = await ws_until(ws, "turn_end")
    assert events[-1]["interrupted"] is True and events[-1]["outcome"] == "stale"
    store = Store(Settings.load().paths.db)
    conversation = store.conversation("job")
    assert conversation is not None
    parts = [p for m in store.branch(conversation.id) for p in m.message.parts]
    store.close()
    results = {p.call_id: p.content for p in parts if isinstance(p, ToolResult)}
    assert results.get("c1") == "quick done"
    assert any(isinstance(p, Text) and "Step one." in p.text for p in parts)


async def test_stop_as_a_command_is_never_refused_even_with_config_broken():
    """A terminal client sends /stop as a command (Ctrl-C): a config.toml broken since the
    serve started refuses new turns, never the stop of a running one."""
    registry, _gate = _gated()  # the gate stays shut: only /stop ends the turn
    script = [Reply([ToolCall("c1", "wait_gate", {})], "tool")]
    async with running_serve(ScriptedProvider(script), registry) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "job")
        await ws.send(json.dumps({"type": "send", "text": "wait for the gate"}))
        while (await ws_next(ws))["type"] != "tool_start":
            pass
        Settings.load().paths.config.write_text("[agent\n")
        await ws.send(json.dumps({"type": "command", "text": "/new"}))
        refused = await ws_next(ws)
        await ws.send(json.dumps({"type": "command", "text": "/stop"}))
        events = await ws_until(ws, "turn_end")
    assert refused["code"] == "refused" and "malformed TOML" in refused["message"]
    assert events[-1]["interrupted"] is True
    assert not any(e["type"] == "error" for e in events)


async def test_a_send_refused_for_a_broken_config_gives_its_text_back():
    """qa24c C1: the browser clears its box as it sends; the refusal of a send (config.toml
    broken since the serve started) carried no text, so the browser could not put it back,
    and the message was lost. Each refusal of a send carries it, and says nothing was sent."""
    async with running_serve(ScriptedProvider(_echo)) as serve, ws_client(serve) as ws:
        await ws_hello(ws)
        Settings.load().paths.config.write_text("[tools\n")
        said = "A long thought I typed with care."
        await ws.send(json.dumps({"type": "send", "text": said}))
        refused = await ws_next(ws)
        await ws.send(json.dumps({"type": "send", "text": "x", "files": ["nope"]}))
        attach = await ws_next(ws)
    assert refused["code"] == "refused" and refused["text"] == said
    assert "malformed TOML" in refused["message"]
    assert attach["code"] == "refused" and attach["text"] == "x"


async def test_a_ws_upgrade_from_another_origin_or_none_is_refused():
    async with running_serve(ScriptedProvider([])) as serve:
        for origin in ("http://evil.example", None):
            with pytest.raises(InvalidStatus) as refused:
                async with ws_client(serve, origin=origin):
                    pass
            assert refused.value.response.status_code == 403
        async with ws_client(serve) as ws:  # the served origin is let in
            assert (await ws_hello(ws))["type"] == "welcome"


async def test_the_control_socket_is_private_and_speaks_the_same_protocol():
    async with running_serve(ScriptedProvider(_echo)) as serve:
        path = serve.info.socket
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        client = await LineClient.open(path)
        await client.send({"type": "hello", "conversation": "k", "last_seq": None})
        assert (await client.next())["type"] == "welcome"
        await client.send({"type": "send", "text": "via the socket"})
        events = await client.until("idle")
        await client.send({"type": "bogus"})
        refusal = await client.next()
        await client.close()
    assert "".join(e["text"] for e in events if e["type"] == "delta") == "echo: via the socket"
    assert refusal["type"] == "error" and refusal["hint"]


async def test_shutdown_stops_a_running_turn_its_clients_hear_the_end_and_the_files_go():
    registry, _gate = _gated()
    script = [Reply([Text("Starting."), ToolCall("c1", "wait_gate", {})], "tool")]
    async with running_serve(ScriptedProvider(script), registry) as serve:
        async with ws_client(serve) as ws:
            await ws_hello(ws)
            await ws.send(json.dumps({"type": "send", "text": "go"}))
            await ws_until(ws, "tool_start")
            serve.stop.set()  # what SIGTERM does
            end = await ws_until(ws, "turn_end")
        await asyncio.wait_for(serve.task, 30)
        home = Settings.load().paths.home
    assert end[-1]["interrupted"] is True
    assert not (home / SOCKET_NAME).exists() and not (home / INFO_NAME).exists()


async def test_shutdown_tells_every_client_the_serve_stopped_and_closes_its_connection():
    registry, _gate = _gated()
    script = [Reply([Text("Starting."), ToolCall("c1", "wait_gate", {})], "tool")]
    out, err = StringIO(), StringIO()
    async with running_serve(ScriptedProvider(script), registry) as serve:
        async with ws_client(serve) as ws:
            await ws_hello(ws, "job")
            path = Path(serve.info.socket)
            run = asyncio.create_task(run_remote(path, "go", "default", "job", out, err))
            await ws_until(ws, "tool_start")  # the thin client's turn runs
            idle = await LineClient.open(path)  # a client attached to nothing yet
            serve.stop.set()  # what SIGTERM does
            seen = await ws_until(ws, "error")
            with pytest.raises(ConnectionClosed) as closed:
                await ws_next(ws)
            ok = await asyncio.wait_for(run, 30)
            last = await idle.next()
            assert await idle.reader.read() == b""  # then the socket closes
            await idle.close()
        await asyncio.wait_for(serve.task, 30)
    ends = [e for e in seen if e["type"] == "turn_end"]
    assert ends and ends[0]["interrupted"] and ends[0]["error"] == "heron serve stopped"
    stopped = seen[-1]
    assert stopped["message"] == "heron serve stopped" and stopped["code"] == "serve_stopped"
    assert stopped["hint"] and last == stopped
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert ok is False  # the thin client's exit code is 1
    assert "heron serve stopped" in err.getvalue()
    assert "Starting." in out.getvalue()  # the partial reply it had streamed stays printed


def test_a_second_serve_on_the_home_is_refused_naming_the_first():
    home = Settings.load().paths.ensure().home
    with ServeLock(home) as first:
        first.publish("http://127.0.0.1:1234")
        with pytest.raises(ConfigError) as refused:
            ServeLock(home).acquire()
    message = str(refused.value)
    assert f"pid {os.getpid()}" in message and "http://127.0.0.1:1234" in message


def test_files_left_by_a_killed_serve_do_not_block_a_new_one():
    home = Settings.load().paths.ensure().home
    (home / INFO_NAME).write_text(json.dumps({"pid": 999999, "url": "http://x", "socket": "s"}))
    (home / SOCKET_NAME).write_text("")  # a stale socket file
    with ServeLock(home) as lock:
        assert not (home / SOCKET_NAME).exists()
        info = lock.publish("http://127.0.0.1:9")
        assert read_info(home) == info and info.pid == os.getpid()
    assert read_info(home) is None
    assert sorted(p.name for p in home.iterdir() if p.name.startswith("serve")) == []


def test_a_serve_that_locked_the_file_the_last_one_removed_locks_the_new_one(monkeypatch):
    """A clean exit removes serve.lock while still holding it: a serve that opened the file
    just before must not keep the lock of a file no longer there, or a third serve would
    lock a new serve.lock beside it and two would run on one home."""
    import fcntl

    from heron.serve import lock as lock_module

    home = Settings.load().paths.ensure().home
    real, locked = fcntl.flock, []

    def flock(fd: int, op: int) -> None:
        if not locked:  # between this serve's open and its flock, the one before it left
            (home / lock_module.LOCK_NAME).unlink()
        locked.append(fd)
        real(fd, op)

    (home / lock_module.LOCK_NAME).touch()
    monkeypatch.setattr(lock_module.fcntl, "flock", flock)
    with ServeLock(home):
        monkeypatch.setattr(lock_module.fcntl, "flock", real)
        with pytest.raises(ConfigError):  # the file in the folder is the one held
            ServeLock(home).acquire()
    assert len(locked) == 2


# ---- the hub alone --------------------------------------------------------------------------


def _delta(key: str, text: str) -> TurnEvent:
    return TurnEvent("web", "1", key, "delta", text)


async def test_the_journal_is_bounded_and_an_old_last_seq_is_told_gap():
    hub = Hub(size=5)
    for i in range(8):
        await hub.deliver(_delta("k", str(i)))
    client = Client("web", "c")
    hub.attach(client, "k", 2)  # events 3.. are kept only from 4 on
    welcome = client.queue.get_nowait()
    assert welcome["gap"] is True and welcome["seq"] == 8 and client.queue.empty()
    again = Client("web", "d")
    hub.attach(again, "k", 5)
    assert again.queue.get_nowait().get("gap") is None
    assert [again.queue.get_nowait()["seq"] for _ in range(3)] == [6, 7, 8]


async def test_a_client_that_falls_behind_never_blocks_the_others_and_is_told_to_resync():
    hub = Hub()
    slow, fast = Client("web", "slow"), Client("web", "fast")
    hub.attach(slow, "k", None)
    hub.attach(fast, "k", None)
    fast.queue.get_nowait()
    for i in range(CLIENT_QUEUE + 5):
        await hub.deliver(_delta("k", str(i)))
        if not fast.queue.empty():
            fast.queue.get_nowait()  # the fast client keeps up
    assert slow.gaps == 1
    events = [slow.queue.get_nowait() for _ in range(slow.queue.qsize())]
    assert events[0]["type"] == "welcome" and events[0]["gap"] is True
    assert [e["seq"] for e in events[1:]] == list(range(events[0]["seq"] + 1, CLIENT_QUEUE + 6))
    assert fast.gaps == 0


async def test_a_turn_end_carries_its_usage_and_what_it_cost():
    hub = Hub(cost=lambda usage: usage.input * 0.001 + usage.output * 0.002)
    client = Client("web", "c")
    hub.attach(client, "k", None)
    end = TurnEnd(True, "delivered", usage=Usage(input=100, output=10, cache_read=40))
    await hub.deliver(TurnEvent("web", "c", "k", "turn_end", end=end))
    client.queue.get_nowait()  # welcome
    event = client.queue.get_nowait()
    assert event["usage"] == {"input": 100, "output": 10, "cache_read": 40, "cache_write": 0}
    assert event["cost_usd"] == pytest.approx(0.12)


async def test_a_send_the_serve_does_not_take_is_refused_to_that_client_alone():
    from heron.messages import MESSAGE_LIMIT

    async with running_serve(ScriptedProvider(_echo)) as serve, ws_client(serve) as ws:
        await ws_hello(ws)
        await ws.send(json.dumps({"type": "send", "text": "x" * (MESSAGE_LIMIT + 1)}))
        too_large = await ws_next(ws)
        config = Settings.load().paths.config
        config.write_text("[agent\n")  # broken after the serve loaded it
        await ws.send(json.dumps({"type": "send", "text": "hello"}))
        broken = await ws_next(ws)
        await ws.send(json.dumps({"type": "command", "text": "/status"}))
        command = await ws_next(ws)
        config.write_text("")  # fixed: taken again
        await ws.send(json.dumps({"type": "send", "text": "hello"}))
        events = await ws_until(ws, "turn_end")
    assert too_large["code"] == "refused" and "one message holds at most 8 MB" in str(too_large)
    assert broken["code"] == "refused" and "malformed TOML" in broken["message"]
    assert broken["hint"] == "Fix that line, or move the file aside."
    # each refusal gives its own text back (qa24c C1), and says the same otherwise
    assert (broken.pop("text"), command.pop("text")) == ("hello", "/status") and command == broken
    assert events[0]["type"] == "turn_start" and events[0]["text"] == "hello"


async def test_a_resume_moves_only_the_client_that_typed_it():
    """`/resume KEY` from one client (QA20m #1): that client alone is told to switch; another
    client on the same conversation stays there, hears a note that names where the other went
    rather than "Resumed", and its next message is answered where it is."""
    async with (
        running_serve(ScriptedProvider(_echo)) as serve,
        ws_client(serve) as a,
        ws_client(serve) as b,
    ):
        await ws_hello(a, "long")
        await a.send(json.dumps({"type": "send", "text": "said in long"}))
        await ws_until(a, "idle")
        await ws_hello(a)
        mine = (await ws_hello(b))["chat_id"]
        await b.send(json.dumps({"type": "command", "text": "/resume long"}))
        seen_b, seen_a = await ws_until(b, "idle"), await ws_until(a, "idle")
        await a.send(json.dumps({"type": "send", "text": "where does this go"}))
        after = await ws_until(a, "idle")
    said_b = [e for e in seen_b if e["type"] == "message"]
    said_a = [e for e in seen_a if e["type"] == "message"]
    assert said_b[0]["text"].startswith("Resumed long") and said_b[0]["chat_id"] == mine
    assert said_a[0]["text"] == (
        "/resume from the browser opened conversation 'long' there; this one stays on 'personal'."
    )
    assert seen_b[-2]["type"] == "turn_end" and seen_b[-2]["switch_to"] == "long"
    assert seen_a[-2]["type"] == "turn_end" and seen_a[-2]["switch_to"] is None
    assert seen_a[-2]["chat_id"] == mine  # whose turn it was
    assert {e["conversation"] for e in after} == {"personal"}
    assert [e["text"] for e in after if e["type"] == "delta"] == ["echo: where does this go"]
