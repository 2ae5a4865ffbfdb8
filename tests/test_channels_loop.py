"""Every channel goes through the AgentLoop and the bus: what a channel sees of a turn, /new
while a message waits, the channel in the runtime block, `heron run` told it waits."""

from __future__ import annotations

import asyncio
from io import StringIO

from waiting import until

from heron.agent.engine import Engine
from heron.agent.leases import hold_lease
from heron.agent.loop import AgentLoop
from heron.bus import InboundMessage, MessageBus, OutboundMessage, TurnEvent
from heron.channels.script import run_once
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.store import Store
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool


def _drain(bus: MessageBus) -> list[OutboundMessage | TurnEvent]:
    return [bus.outbound.get_nowait() for _ in range(bus.outbound.qsize())]


def _gated() -> tuple[ToolRegistry, asyncio.Event]:
    gate = asyncio.Event()

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Wait until the test opens the gate."""
        await gate.wait()
        return "gate passed"

    return ToolRegistry([wait_gate]), gate


async def test_a_channel_that_asks_sees_the_turn_as_it_happens_and_others_see_only_answers():
    registry, gate = _gated()
    gate.set()
    script = [
        Reply([Text("Let me check."), ToolCall("c1", "wait_gate", {})], "tool"),
        Reply([Text("All clear.")], "done"),
        Reply([Text("Plain answer.")], "done"),
    ]
    bus = MessageBus()
    provider = ScriptedProvider(script)
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("terminal", "1", "check it", "a", events=True))
        await loop.wait_idle()
        watched = _drain(bus)
        await loop.dispatch(InboundMessage("script", "1", "and again", "b"))
        await loop.wait_idle()
        plain = _drain(bus)
    kinds = [(o.kind, o.text) for o in watched]
    assert kinds[0] == ("turn_start", "check it")  # the message that opened it
    assert ("delta", "Let me check.") in kinds and ("delta", "All clear.") in kinds
    tools = [o for o in watched if isinstance(o, TurnEvent) and o.kind.startswith("tool_")]
    assert [t.kind for t in tools] == ["tool_start", "tool_end"]
    assert tools[1].result is not None and tools[1].result.content == "gate passed"
    assert kinds[-2] == ("answer", "All clear.")  # the answer, then the end, in that order
    end = watched[-1]
    assert isinstance(end, TurnEvent) and end.kind == "turn_end" and end.end is not None
    assert end.end.ok and end.end.model_calls == 2 and end.end.outcome == "delivered"
    assert [(o.kind, o.text) for o in plain] == [("answer", "Plain answer.")]


async def test_new_while_a_message_waits_runs_one_turn_at_a_time_and_keeps_the_message():
    registry, _ = _gated()  # the gate stays shut: /new must stop the turn

    async def answer(request: ChatRequest) -> Reply:
        said = request.messages[-1].text
        if "start the job" in said:
            return Reply([ToolCall("c1", "wait_gate", {})], "tool")
        return Reply([Text("answered: " + said.partition("[Runtime")[0].strip())], "done")

    bus = MessageBus()
    provider = ScriptedProvider(answer)
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("terminal", "1", "start the job", "k", events=True))
        await until(lambda: len(provider.requests) == 1)
        await loop.dispatch(InboundMessage("terminal", "1", "the follow-up", "k", events=True))
        await loop.dispatch(InboundMessage("terminal", "1", "/new", "k", events=True))
        await loop.wait_idle()
        out = _drain(bus)
        conversation = engine.store.conversation("k")
        users = [m.message.text for m in engine.store.branch(conversation.id) if m.role == "user"]
    notices = [o.text for o in out if isinstance(o, OutboundMessage) and o.kind == "notice"]
    assert notices == []  # never "busy in another session": one turn of "k" at a time
    starts = [o for o in out if isinstance(o, TurnEvent) and o.kind == "turn_start"]
    ends = [o.end for o in out if isinstance(o, TurnEvent) and o.kind == "turn_end"]
    assert len(starts) == len(ends) == 3  # the stopped turn, /new, the follow-up
    assert ends[0] is not None and ends[0].outcome == "stale"
    assert ends[1] is not None and ends[1].command == "new"
    assert ends[2] is not None and ends[2].reply == "answered: the follow-up"
    assert users[-1] == "the follow-up"  # kept, in the fresh context after /new


async def test_the_runtime_block_names_the_channel_the_message_came_from():
    provider = ScriptedProvider([Reply([Text("hi")], "done")])
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("web", "tab1", "hello", "w"))
        await loop.wait_idle()
    sent = provider.requests[0].messages[-1].text
    assert "Channel: web" in sent and "Channel: cli" not in sent


async def test_a_turn_heron_opens_names_itself_as_the_channel_not_the_client():
    provider = ScriptedProvider([Reply([Text("on it")], "done")])
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider) as engine:
        loop = AgentLoop(engine, bus)
        nudge = InboundMessage("script", "goal", "Your goal continues.", "g", provenance="goal")
        await loop.dispatch(nudge)
        await loop.wait_idle()
    sent = provider.requests[0].messages[-1].text
    assert "Channel: heron (goal)" in sent and "Channel: script" not in sent


async def test_heron_run_says_when_another_session_holds_the_conversation():
    settings = Settings.load()
    store = Store(settings.paths.ensure().db)
    conversation = store.open_conversation("held")
    out, err = StringIO(), StringIO()
    provider = ScriptedProvider([Reply([Text("hello")], "done")])
    async with hold_lease(store, conversation.id):
        run = run_once(settings, "hi", "default", "held", None, False, out, err, provider)
        task = asyncio.create_task(run)
        await until(lambda: "busy in another session" in err.getvalue())
        assert not task.done()  # it waits for the other session
    assert await task
    store.close()
    assert out.getvalue() == "hello\n"
