"""A tool call running when its turn was stopped (/stop, Ctrl-C) is in the trace, as the
conversation lists it (QA21r finding 12: `trace show` had only `stop: tool`, `trace export`
"tool_calls": [], `trace ls` TOOLS 0): its arguments, the interrupted result with what it had
printed, and that it was interrupted. A replay stops where the run stopped, never running the
stopped call again (a live replay of an endless loop would not end)."""

from __future__ import annotations

import asyncio
import json

import pytest

from heron.agent.engine import Engine
from heron.agent.replay import replay
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, ToolResult, Usage
from heron.providers.scripted import ScriptedProvider
from heron.store.engine_state import INTERRUPTED
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool
from heron.trace.prices import PriceTable
from heron.trace.read import list_runs, load_run
from heron.trace.render import export_run, ls_rows, render_show
from heron.trace.scrub import Scrubber

PRINTED = "tick 1\ntick 2\ntick 3"


def waiting_registry(started: asyncio.Event, runs: list[int]) -> ToolRegistry:
    """`wait_forever` prints three ticks and waits until it is cancelled, leaving what it
    printed as a stopped cell does; `quick` answers at once."""

    @tool
    async def wait_forever(ctx: ToolContext, seconds: int) -> str:
        """Wait."""
        runs.append(seconds)
        started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            ctx.leave_partial(PRINTED)
            raise
        return "waited"

    @tool
    def quick(ctx: ToolContext) -> str:
        """Answer."""
        return "quick answer"

    return ToolRegistry([wait_forever, quick])


def stored_result(engine: Engine, key: str, call_id: str) -> ToolResult:
    conversation = engine.store.conversation(key)
    for row in engine.store.branch(conversation.id):
        for part in row.message.tool_results:
            if part.call_id == call_id:
                return part
    raise AssertionError(f"no result for {call_id}")


async def test_a_tool_call_stopped_with_its_turn_is_in_the_trace() -> None:
    started, runs = asyncio.Event(), []
    registry = waiting_registry(started, runs)
    calls = [ToolCall("q1", "quick", {}), ToolCall("w1", "wait_forever", {"seconds": 100})]
    provider = ScriptedProvider([Reply(calls, "tool", Usage(1, 1)), Reply([Text("x")], "done")])
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        turn = asyncio.create_task(engine.turn("k", "wait"))
        await asyncio.wait_for(started.wait(), 30)
        turn.cancel()  # a hard stop, as /stop and Ctrl-C stop a turn
        with pytest.raises(asyncio.CancelledError):
            await turn
        (summary,) = list_runs(engine.store, "k")
        run = load_run(engine.store, summary.run_id)
        conversation = stored_result(engine, "k", "w1")
        shown = "\n".join(render_show(engine.store, run, PriceTable(), "UTC"))
        exported = json.loads(export_run(engine.store, summary.run_id, Scrubber()))
        replayed = await replay(engine.store, summary.run_id, registry=registry)
        live = await replay(engine.store, summary.run_id, registry=registry, live_tools=True)
    assert conversation.content == f"{INTERRUPTED}. What it printed before it stopped:\n{PRINTED}"
    stopped = {t.call_id: t for t in run.tools}["w1"]
    assert stopped.interrupted and stopped.is_error and stopped.name == "wait_forever"
    assert json.loads(stopped.args) == {"seconds": 100}
    assert stopped.result == conversation.content  # the trace says what the conversation says
    assert not {t.call_id: t for t in run.tools}["q1"].interrupted
    # trace ls, trace show and trace export agree with the conversation
    assert summary.turn.tool_calls == 2 and ls_rows([summary], PriceTable(), "UTC")[0][5] == "2"
    assert "wait_forever" in shown and "interrupted" in shown and "tick 3" in shown
    tools = {t["call_id"]: t for t in exported["tool_calls"]}
    assert tools["w1"]["interrupted"] and tools["w1"]["result"] == conversation.content
    # A replay stops where the run stopped; a live one does not run the stopped call again.
    assert replayed.identical and replayed.replayed_stop == "interrupted", replayed.render()
    assert live.replayed_stop == "interrupted" and runs == [100], live.render()
