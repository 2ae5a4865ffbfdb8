"""A turn stopped from elsewhere: /stop or /new from another process only bumps the stored
epoch, and the running turn must notice it (its watch of the epoch, or its next commit) and stop
exactly as a /stop in its own AgentLoop stops it: what streamed kept as the interrupted answer,
the call counted, the turn not ok, and its channel told what stopped it. And a lease left by a
process that ended (a zombie included) is taken at once, with a word, never "busy"."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest

from heron.agent import leases
from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.agent.turn import REPLY_STOPPED
from heron.bus import InboundMessage, MessageBus, OutboundMessage, TurnEnd, TurnEvent
from heron.channels.script import run_once
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest, OnEvent, StreamEvent
from heron.store import Store
from heron.store import engine_state as es

ELSEWHERE = "/stop from heron run (process 1)"


class StreamsThenWaits(ScriptedProvider):
    """The first call streams two pieces of a reply, then nothing: only a stop ends it. Every
    later call answers at once."""

    def __init__(self) -> None:
        super().__init__(lambda request: Reply([Text("next answer")], "done", Usage(5, 1)))
        self.streaming = asyncio.Event()

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        if self.requests:
            return await super().chat(request, on_event)
        self.requests.append(request)
        for piece in ("Hello, ", "I am"):
            if on_event is not None:
                on_event(StreamEvent("text", piece))
        self.streaming.set()
        await asyncio.Event().wait()
        raise AssertionError("never reached")


def _drain(bus: MessageBus) -> list[OutboundMessage | TurnEvent]:
    return [bus.outbound.get_nowait() for _ in range(bus.outbound.qsize())]


def _end_of(out: list[OutboundMessage | TurnEvent]) -> TurnEnd:
    (end,) = [o.end for o in out if isinstance(o, TurnEvent) and o.kind == "turn_end"]
    assert end is not None
    return end


async def _stopped(how: str) -> dict[str, object]:
    """One streamed turn stopped mid-reply, `here` by /stop in its AgentLoop (typed in the
    browser), or `elsewhere` as another process stops it; then the next turn. What the record,
    the channel and the next request say."""
    provider, key = StreamsThenWaits(), f"k-{how}"
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider) as engine:
        store = engine.store
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("script", "c", "go", key, events=True))
        await asyncio.wait_for(provider.streaming.wait(), 10)
        if how == "here":
            await loop.dispatch(InboundMessage("web", "tab", "/stop", key))
        else:
            es.bump_epoch(store, store.conversation(key).id, ELSEWHERE)
        await asyncio.wait_for(loop.wait_idle(), 10)  # the call never ends: the stop ends it
        stopped = _drain(bus)
        conversation = store.conversation(key)
        rows = [(m.role, m.message.text) for m in store.branch(conversation.id)]
        (turn,) = store.turns(conversation.id)
        await loop.dispatch(InboundMessage("script", "c", "and now?", key))
        await asyncio.wait_for(loop.wait_idle(), 10)
    seen = [(m.role, m.text) for m in provider.requests[1].messages]
    figures = (turn.status, turn.model_calls, turn.usage_unknown)
    return {"rows": rows, "figures": figures, "end": _end_of(stopped), "seen": seen}


async def test_a_stop_from_another_process_stops_the_stream_as_a_stop_here_does(monkeypatch):
    monkeypatch.setattr(leases, "EPOCH_POLL", 0.05)
    here, elsewhere = await _stopped("here"), await _stopped("elsewhere")
    kept = f"Hello, I am\n\n{REPLY_STOPPED}"
    assert elsewhere["rows"] == here["rows"] == [("user", "go"), ("assistant", kept)]
    assert elsewhere["figures"] == here["figures"] == ("interrupted", 1, True)
    assert ("assistant", kept) in elsewhere["seen"]  # the model reads what the person read
    ends = {how: result["end"] for how, result in (("here", here), ("elsewhere", elsewhere))}
    assert [(e.ok, e.outcome) for e in ends.values()] == [(False, "stale")] * 2
    assert ends["here"].stopped_by == "/stop from the browser"
    assert ends["elsewhere"].stopped_by == ELSEWHERE


async def test_a_stop_that_lands_after_the_stream_keeps_what_streamed():
    """The bump lands once the reply has streamed, before SAVE (the watch never looked in
    between): SAVE finds the turn stale and closes it as a stop does, keeping the reply the
    person read as the interrupted answer, with the call counted and what stopped it said."""
    engine_ref: list[Engine] = []

    async def answer(request: ChatRequest) -> Reply:
        store = engine_ref[0].store
        es.bump_epoch(store, store.conversation("k").id, "/new from heron chat (process 2)")
        return Reply([Text("late but read")], "done", Usage(5, 1))

    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        engine_ref.append(engine)
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("script", "c", "hello", "k", events=True))
        await asyncio.wait_for(loop.wait_idle(), 10)
        conversation = engine.store.conversation("k")
        rows = [(m.role, m.message.text) for m in engine.store.branch(conversation.id)]
        (turn,) = engine.store.turns(conversation.id)
    end = _end_of(_drain(bus))
    assert rows == [("user", "hello"), ("assistant", f"late but read\n\n{REPLY_STOPPED}")]
    assert (turn.status, turn.stop_reason, turn.model_calls) == ("interrupted", "stale", 1)
    assert (end.ok, end.outcome, end.reply) == (False, "stale", None)
    assert end.stopped_by == "/new from heron chat (process 2)"


async def test_new_in_the_same_loop_says_it_was_new_and_where_it_came_from():
    provider = StreamsThenWaits()
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("script", "c", "go", "k", events=True))
        await asyncio.wait_for(provider.streaming.wait(), 10)
        await loop.dispatch(InboundMessage("terminal", "t", "/new", "k"))
        await asyncio.wait_for(loop.wait_idle(), 10)
    ended = [o for o in _drain(bus) if isinstance(o, TurnEvent) and o.chat_id == "c"]
    end = _end_of(ended)
    assert (end.ok, end.outcome, end.stopped_by) == (False, "stale", "/new from heron chat")


def _zombie(db: str, key: str) -> subprocess.Popen[str]:
    """A process of this host that claimed `key`'s lease, then was killed and not reaped."""
    code = (
        "import sys, time\n"
        "from heron.store import Store\n"
        "from heron.store import engine_state as es\n"
        "store = Store(sys.argv[1])\n"
        "claim = es.try_lease(store, store.open_conversation(sys.argv[2]).id, 'gone', 300.0)\n"
        "assert claim.holder is None\n"
        "print('held', flush=True)\n"
        "time.sleep(3600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, db, key], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    child.stdout.close()
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _state(child.pid).startswith("Z"):  # dead, its pid kept until we reap it
        assert time.monotonic() < deadline, "the child never became a zombie"
        time.sleep(0.01)
    return child  # held on to: a Popen let go is reaped by the next one (subprocess._cleanup)


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_a_lease_left_by_a_killed_process_is_taken_at_once_and_said():
    """Killed with kill -9 and not yet reaped by its parent (a serve started by a script), a
    holder still has its pid: it is dead all the same, so `heron run` neither says "busy" nor
    waits for the claim to expire, and says which turn ended unfinished."""
    settings = Settings.load()
    db = str(settings.paths.ensure().db)
    Store(db).close()
    zombie = _zombie(db, "left")
    pid = zombie.pid
    try:
        assert not es.pid_alive(pid)
        out, err = StringIO(), StringIO()
        provider = ScriptedProvider([Reply([Text("hello again")], "done")])
        run = run_once(settings, "hi", "default", "left", None, False, out, err, provider)
        assert await asyncio.wait_for(run, 10)  # not the claim's 300 s
        assert _state(pid).startswith("Z")  # a zombie all along
    finally:
        zombie.wait(10)
    said = err.getvalue()
    assert "busy in another session" not in said
    assert f"a turn in process {pid} ended without finishing (its process has ended)" in said
    assert out.getvalue() == "hello again\n"
