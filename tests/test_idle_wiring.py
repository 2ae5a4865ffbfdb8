"""Idle compaction runs in the background of the AgentLoop (and `heron chat`, through the same
`idle_compaction` block), is cancelled when they end, and is off when the setting is 0. It
yields to the person: no step while a turn they started runs, nor until the loop has been quiet
for `quiet_s` (after its start, after their last turn)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from waiting import UNTIL_S, until

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop, idle_compaction
from heron.bus import InboundMessage, MessageBus
from heron.compaction import compact_idle
from heron.compaction.consolidate import MOVED_ON
from heron.compaction.idle import Quiet
from heron.config import Settings
from heron.messages import Message, Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.store import compactions as folds


def _answer(request: ChatRequest) -> Reply:
    if request.system.startswith("You compact"):
        return Reply([Text("## Facts\nidle facts")], "done")
    return Reply([Text("ok")], "done")


async def _quiet_conversation(engine: Engine) -> int:
    """A conversation with something to fold, last touched an hour ago."""
    for i in range(10):
        await engine.turn("k", f"hello {i}")
    conv = engine.store.conversation("k")
    with engine.store.transaction() as c:
        c.execute(
            "UPDATE conversations SET updated = ? WHERE id = ?", (time.time() - 3600, conv.id)
        )
    return conv.id


async def test_the_agent_loop_compacts_idle_conversations_in_the_background():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(_answer)) as engine:
        cid = await _quiet_conversation(engine)
        loop = AgentLoop(engine, MessageBus(), idle_poll=0.01, quiet_s=0.01)
        running = asyncio.create_task(loop.run())
        await until(lambda: folds.compactions(engine.store, cid) != [])
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        (record,) = folds.compactions(engine.store, cid)
    assert record.reason == "idle" and "idle facts" in record.summary


async def test_the_sweeper_is_cancelled_when_its_block_ends():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(_answer)) as engine:
        cid = await _quiet_conversation(engine)
        async with idle_compaction(engine, poll_s=0.01) as task:
            assert task is not None
            await until(lambda: folds.compactions(engine.store, cid) != [])
        assert task.done() and task.cancelled()


async def test_zero_minutes_turns_idle_compaction_off():
    settings = Settings.load()
    agent = dataclasses.replace(settings.config.agent, idle_compact_after_minutes=0)
    settings = dataclasses.replace(
        settings, config=dataclasses.replace(settings.config, agent=agent)
    )
    async with Engine.open(settings, provider=ScriptedProvider(_answer)) as engine:
        cid = await _quiet_conversation(engine)
        async with idle_compaction(engine, poll_s=0.01) as task:
            assert task is None
        loop = AgentLoop(engine, MessageBus(), idle_poll=0.01)
        running = asyncio.create_task(loop.run())
        for _ in range(20):  # twenty sweep intervals: none may run
            await asyncio.sleep(0.01)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        assert folds.compactions(engine.store, cid) == []


async def test_idle_compaction_waits_while_the_persons_turn_runs():
    """The person's message goes first: a serve started on a home of many idle conversations
    consolidated them one after another while the first turns ran beside them."""
    release = asyncio.Event()
    seen: list[str] = []

    async def answer(request: ChatRequest) -> Reply:
        if request.system.startswith("You compact"):
            seen.append("summary")
        elif "hold on" in request.messages[-1].text:
            seen.append("turn")
            await release.wait()
        return _answer(request)

    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        cid = await _quiet_conversation(engine)
        bus = MessageBus()
        loop = AgentLoop(engine, bus, idle_poll=0.01, quiet_s=0.01)
        bus.inbound.put_nowait(InboundMessage("terminal", "t1", "hold on", "other"))
        running = asyncio.create_task(loop.run())
        await until(lambda: "turn" in seen)
        for _ in range(30):  # thirty sweep intervals while the turn runs: none may fold
            await asyncio.sleep(0.01)
        assert "summary" not in seen and folds.compactions(engine.store, cid) == []
        release.set()
        await until(lambda: folds.compactions(engine.store, cid) != [])
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert seen.index("turn") < seen.index("summary")


async def test_idle_time_work_waits_for_a_quiet_moment_after_the_start():
    async with Engine.open(Settings.load(), provider=ScriptedProvider(_answer)) as engine:
        patient = AgentLoop(engine, MessageBus(), quiet_s=3600.0)
        waiting = asyncio.create_task(patient.person_first())
        for _ in range(10):
            await asyncio.sleep(0)
        assert not waiting.done()  # an hour of quiet since the loop started is not over
        waiting.cancel()
        eager = AgentLoop(engine, MessageBus(), quiet_s=0.0)
        await asyncio.wait_for(eager.person_first(), UNTIL_S)


async def test_a_consolidation_stops_when_its_conversation_moved_on_while_it_waited():
    """Between its phases a sweep waits for the person again; a message in the very
    conversation meanwhile (a new head) leaves it unfolded, for a later sweep."""
    async with Engine.open(Settings.load(), provider=ScriptedProvider(_answer)) as engine:
        cid = await _quiet_conversation(engine)
        waits = 0

        async def quiet() -> None:
            nonlocal waits
            waits += 1
            if waits == 2:  # the conversation was looked at; its summary is next
                engine.store.append(cid, Message("user", [Text("back again")]))

        (report,) = await compact_idle(engine, quiet=Quiet(quiet))
        assert report.kind == "none" and report.why == MOVED_ON
        assert folds.compactions(engine.store, cid) == []
        (done,) = await compact_idle(engine, now=time.time() + 3600, quiet=Quiet(quiet))
        assert done.kind == "consolidation" and waits > 2


async def test_a_step_under_way_steps_aside_when_the_persons_turn_starts():
    """A message sent while a summary was being written waited for the whole of it (a local
    model serves one request at a time): the step is now cancelled, nothing of it stored, and a
    later sweep takes it again."""
    writing, person = asyncio.Event(), asyncio.Event()
    slow = [True]

    async def answer(request: ChatRequest) -> Reply:
        if request.system.startswith("You compact") and slow[0]:
            writing.set()
            await asyncio.sleep(60)  # a long summary on a small machine
        return _answer(request)

    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        cid = await _quiet_conversation(engine)

        async def free() -> None:
            return None

        sweep = asyncio.create_task(compact_idle(engine, quiet=Quiet(free, person.wait)))
        await writing.wait()
        person.set()  # the person's turn starts
        assert await asyncio.wait_for(sweep, UNTIL_S) == []  # stepped aside, nothing reported
        assert folds.compactions(engine.store, cid) == []
        slow[0] = False
        (done,) = await compact_idle(engine, quiet=Quiet(free, asyncio.Event().wait))
        assert done.kind == "consolidation"


async def test_the_agent_loop_stops_a_summary_under_way_for_the_persons_message():
    """The model serves one request at a time, as a local llama.cpp server does: the person's
    message waited behind the idle summary's whole call."""
    writing, slot = asyncio.Event(), asyncio.Lock()
    slow = [True]

    async def answer(request: ChatRequest) -> Reply:
        async with slot:
            if request.system.startswith("You compact") and slow[0]:
                writing.set()
                await asyncio.sleep(60)
            return _answer(request)

    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        cid = await _quiet_conversation(engine)
        bus = MessageBus()
        loop = AgentLoop(engine, bus, idle_poll=0.01, quiet_s=0.01)
        running = asyncio.create_task(loop.run())
        await asyncio.wait_for(writing.wait(), UNTIL_S)
        slow[0] = False  # the step taken again later writes at once
        await loop.dispatch(InboundMessage("t", "1", "a question meanwhile"))
        await asyncio.wait_for(loop.wait_idle(), UNTIL_S)  # not 60 s behind the summary
        answered = engine.store.branch(engine.store.conversation("t:1").id)[-1].message.text
        await until(lambda: folds.compactions(engine.store, cid) != [])  # taken again later
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert answered == "ok"
