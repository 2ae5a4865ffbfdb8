"""The AgentLoop's one end-of-turn mechanism (`watch_turns`): every hook hears every turn's end
once, in order, with what the channel heard and the result, after the conversation's next
queued message has started; a stopped turn is heard as stale; a failing hook harms no other;
`unwatch` removes a hook."""

from __future__ import annotations

import asyncio

from waiting import until

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop, TurnEnded
from heron.bus import InboundMessage, MessageBus
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool


async def test_every_hook_hears_each_end_once_after_the_next_queued_message_started():
    script = [Reply([Text(f"answer {n}")], "done") for n in range(3)]
    heard: list[tuple[str, str, str, bool, bool]] = []
    async with Engine.open(Settings.load(), provider=ScriptedProvider(script)) as engine:
        loop = AgentLoop(engine, MessageBus())

        def broken(ended: TurnEnded) -> None:
            raise RuntimeError("a hook's bug")

        def record(ended: TurnEnded) -> None:
            answered = ended.result is not None and ended.result.reply is not None
            # The queued second message is already running when the first turn's end is heard.
            heard.append(
                (
                    "first" if not heard else "second",
                    ended.message.text,
                    ended.end.outcome,
                    answered,
                    loop.running(ended.key),
                )
            )

        loop.watch_turns(broken)
        unwatch = loop.watch_turns(record)
        await loop.dispatch(InboundMessage("script", "1", "one", "k"))
        loop.start_turn(InboundMessage("script", "1", "two", "k"))  # queued, not mailed
        await loop.wait_idle()
        unwatch()
        unwatch()  # twice is harmless
        assert loop.turn_end_hooks == [broken]
        await loop.dispatch(InboundMessage("script", "1", "three", "k"))
        await loop.wait_idle()
    assert heard == [
        ("first", "one", "delivered", True, True),
        ("second", "two", "delivered", True, False),
    ]


async def test_a_stopped_turn_is_heard_once_as_stale_with_no_result():
    gate = asyncio.Event()

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Wait until the test opens the gate."""
        await gate.wait()
        return "passed"

    script = [Reply([ToolCall("c1", "wait_gate", {})], "tool")]
    heard: list[TurnEnded] = []
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(script), registry=ToolRegistry([wait_gate])
    ) as engine:
        loop = AgentLoop(engine, MessageBus())
        loop.watch_turns(heard.append)
        await loop.dispatch(InboundMessage("script", "1", "wait", "k"))
        await until(lambda: loop.running("k"))
        await asyncio.sleep(0.05)
        assert await loop.stop("k")
        await loop.wait_idle()
        runs = [row[0] for row in engine.store.query("SELECT run_id FROM turns")]
    assert len(heard) == 1
    assert heard[0].end.outcome == "stale" and not heard[0].end.ok and heard[0].result is None
    # The run it recorded, as interrupted: `heron run --json` gave an empty run_id and no stop.
    assert runs == [heard[0].end.run_id] and heard[0].end.stop == "interrupted"
