"""A turn that hit the context limit runs twice: the overflowed run, then a retry built again
for a smaller window. Its trace numbers the two runs apart, in the order they ran, and a replay
compares the first run, says why the retry's requests are not rebuilt, and exits 3 ("could not
check all"), not 1 ("a request differs") (QA21r finding 13)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.agent.replay import replay
from heron.cli import app
from heron.config import Settings
from heron.errors import ContextOverflow
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool
from heron.trace.prices import PriceTable
from heron.trace.read import load_run
from heron.trace.render import export_run, render_show
from heron.trace.scrub import Scrubber


def overflowing() -> ScriptedProvider:
    """A tool call, then an overflow on the run's second request; the retry answers."""
    asked: list[int] = []

    def answer(request: ChatRequest) -> Reply:
        asked.append(1)
        if len(asked) == 1:
            return Reply([ToolCall("t1", "tick", {})], "tool", Usage(5, 1))
        if len(asked) == 2:
            raise ContextOverflow("prompt too long", status=400)
        if len(asked) == 3:  # the retry calls the tool again, under the same id
            return Reply([ToolCall("t1", "tick", {})], "tool", Usage(5, 1))
        return Reply([Text("answered")], "done", Usage(5, 1))

    return ScriptedProvider(answer)


def tick_registry() -> ToolRegistry:
    @tool
    def tick(ctx: ToolContext) -> str:
        """Count."""
        return "tick"

    return ToolRegistry([tick])


async def test_a_turn_retried_after_an_overflow_numbers_its_runs_and_replays_the_first() -> None:
    registry = tick_registry()
    async with Engine.open(Settings.load(), provider=overflowing(), registry=registry) as engine:
        result = await engine.turn("o", "go")
        run = load_run(engine.store, result.run_id)
        shown = "\n".join(render_show(engine.store, run, PriceTable(), "UTC"))
        exported = json.loads(export_run(engine.store, result.run_id, Scrubber()))
        report = await replay(engine.store, result.run_id, registry=registry)
    assert result.ok and result.reply == "answered"
    turn_calls = [(c.attempt, c.seq) for c in run.calls if c.purpose == "turn"]
    assert turn_calls == [(1, 1), (1, 2), (2, turn_calls[2][1]), (2, turn_calls[3][1])]
    assert [t.attempt for t in run.tools] == [1, 2]
    assert [c["attempt"] for c in exported["model_calls"]] == [c.attempt for c in run.calls]
    lines = [line for line in shown.splitlines() if line.startswith("  #") and " turn" in line]
    assert lines[0].startswith("  #1 turn · ") and lines[1].startswith("  #2 turn · ")
    assert ", retry after overflow · " in lines[2] and ", retry after overflow · " in lines[3]
    # The first run is compared; the retry's requests are named, with why they are not.
    assert report.replayed_requests == 2 and report.first is None, report.render()
    assert report.exit_status == 3 and not report.identical
    said = report.render()
    assert "every request rebuilt is identical" in said
    assert f"requests 3-{len(run.calls)} not rebuilt" in said and "overflow" in said


def test_the_replay_command_exits_3_when_only_the_retry_went_unchecked(monkeypatch) -> None:
    import asyncio

    registry = tick_registry()

    async def record() -> str:
        async with Engine.open(Settings.load(), provider=overflowing(), registry=registry) as e:
            return (await e.turn("o", "go")).run_id

    run_id = asyncio.run(record())
    monkeypatch.setattr("heron.proactive.wiring.replay_registry", lambda: registry)
    out = CliRunner().invoke(app, ["trace", "replay", run_id])
    assert out.exit_code == 3, out.output
    assert "not rebuilt" in out.output


async def test_the_turn_row_counts_the_calls_and_tokens_of_both_runs() -> None:
    """The retry's figures replaced the overflowed run's on the turn row: a turn whose retry
    sent nothing showed `CALLS 0` in `trace ls` though its first request was sent (QA22x L3),
    and a retried turn's cost left out its first run."""
    registry = tick_registry()
    async with Engine.open(Settings.load(), provider=overflowing(), registry=registry) as engine:
        result = await engine.turn("o", "go")
        run = load_run(engine.store, result.run_id)
    assert result.ok
    assert run.turn.model_calls == len(run.calls)
    assert run.turn.tool_calls == len(run.tools) == 2
    assert run.turn.usage.input == sum(c.usage.input for c in run.calls)
