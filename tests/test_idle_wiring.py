"""Idle compaction runs in the background of the AgentLoop (and `heron chat`, through the same
`idle_compaction` block), is cancelled when they end, and is off when the setting is 0."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from waiting import until

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop, idle_compaction
from heron.bus import MessageBus
from heron.config import Settings
from heron.messages import Reply, Text
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
        loop = AgentLoop(engine, MessageBus(), idle_poll=0.01)
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
