"""Replay: a recorded session runs again without the model, with identical requests; a change in
prompt assembly is reported at the request and part where it shows."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from heron.agent.control import TurnControl
from heron.agent.engine import Engine, TurnHooks
from heron.agent.loop import AgentLoop
from heron.agent.replay import replay
from heron.bus import MessageBus
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.proactive import wiring
from heron.providers.anthropic import AnthropicProvider
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool
from heron.trace.read import list_runs, load_run

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")


def _tool_call(call_id: str, code: str) -> Reply:
    return Reply([ToolCall(call_id, "run_cell", {"code": code})], "tool", Usage(100, 10))


async def test_a_scripted_session_with_tools_replays_with_identical_requests():
    provider = ScriptedProvider(
        [
            _tool_call("c1", "x = 6 * 7\nprint(x)"),
            Reply([Text("x is 42.")], "done", Usage(120, 5)),
            _tool_call("c2", "print(x + 1)"),
            Reply([Text("43.")], "done", Usage(140, 5)),
        ]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("s", "set x with python")
        await engine.turn("s", "and x + 1?")
        runs = list_runs(engine.store, "s")
        reports = [await replay(engine.store, r.run_id) for r in runs]
    assert len(reports) == 2
    for report in reports:
        assert report.identical, report.render()
        assert report.replayed_requests == 2 and report.replayed_stop == "done"


async def test_a_change_in_prompt_assembly_is_reported_at_the_right_request_and_part(
    monkeypatch,
):
    provider = ScriptedProvider([_tool_call("c1", "print(1)"), Reply([Text("ok")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("p", "go")
        assert load_run(engine.store, result.run_id).start["prompt_inputs"] is not None
        # A deliberate change: the tool contract gains a sentence.
        import heron.context.prompt as prompt

        monkeypatch.setattr(prompt, "TOOL_CONTRACT", prompt.TOOL_CONTRACT + " Be brief.")
        report = await replay(engine.store, result.run_id)
    assert not report.identical
    number, diff = report.first
    assert number == 1 and diff.path == ("system",)
    assert "the system prompt" in report.render() and "Be brief." in report.render()
    assert report.differing_requests == 2


async def test_a_changed_message_is_located_by_message_and_part(monkeypatch):
    provider = ScriptedProvider([_tool_call("c1", "print(1)"), Reply([Text("ok")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("m", "go")
        # A deliberate change in how tool results are assembled into the request.
        import heron.agent.replay_serve as rp

        served = rp.ReplayTools.call

        async def altered(self, call, ctx, on_start=None):
            r = await served(self, call, ctx, on_start)
            return type(r)(r.call_id, r.content + "!", r.is_error)

        monkeypatch.setattr(rp.ReplayTools, "call", altered)
        report = await replay(engine.store, result.run_id)
    number, diff = report.first
    # Request 2 is [user message, assistant tool call, user tool result]: message 2, part 0.
    assert number == 2 and diff.path[:4] == ("messages", 2, "parts", 0)
    assert diff.where.startswith("message 2 (user), part 0 (tool_result), field content")


async def test_the_openai_wire_replays_identically():
    script = [
        ServerReply(tool_calls=[("call_1", "run_cell", {"code": "print(2)"})]),
        ServerReply(text="Two."),
    ]
    with FakeOpenAIServer(script) as server:
        provider = OpenAICompatProvider("gpt-4.1-mini", "dummy-key-123456", server.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            result = await engine.turn("o", "what is 2?")
            report = await replay(engine.store, result.run_id)
    assert report.identical and report.replayed_requests == 2, report.render()


async def test_the_anthropic_wire_replays_identically_with_its_breakpoints():
    script = [
        ServerReply(tool_calls=[("toolu_1", "run_cell", {"code": "print(2)"})]),
        ServerReply(text="Two."),
        ServerReply(text="Three."),
    ]
    with FakeAnthropicServer(script) as server:
        provider = AnthropicProvider("claude-sonnet-4-5", "sk-ant-test-123456", server.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            await engine.turn("a", "what is 2?")
            result = await engine.turn("a", "and 3?")
            report = await replay(engine.store, result.run_id)
    assert report.identical and report.replayed_requests == 1, report.render()
    marks = json.dumps(server.requests[-1]).count('"cache_control"')
    assert marks == 4  # tools, system, where the previous request ended, the end


async def test_mailbox_injections_and_a_soft_break_replay():
    control = TurnControl("mb")
    first = asyncio.Event()

    def script(request: ChatRequest) -> Reply:
        n = len([m for m in request.messages if m.role == "assistant"])
        if not first.is_set():
            first.set()
            control.mailbox.post("also print 3")  # typed while the first call is out
            return _tool_call("c1", "print(1)")
        if n == 1:
            control.mailbox.request_break()
            return _tool_call("c2", "print(3)")
        return Reply([Text("Stopped: printed 1 and 3.")], "done")

    async with Engine.open(Settings.load(), provider=ScriptedProvider(script)) as engine:
        result = await engine.turn("mb", "print 1", TurnHooks(control=control))
        run = load_run(engine.store, result.run_id)
        report = await replay(engine.store, result.run_id)
    kinds = [(e.kind, e.after_call) for e in run.events]
    assert ("injection", 1) in kinds and ("break", 2) in kinds
    assert run.turn.stop_reason == "wrapup" and len(run.calls) == 3
    assert report.identical and report.replayed_stop == "wrapup", report.render()


async def test_a_hard_interruption_replays_to_the_same_point():
    second = asyncio.Event()
    never = asyncio.Event()

    async def script(request: ChatRequest) -> Reply:
        if len(request.messages) == 1:
            return _tool_call("c1", "print(1)")
        second.set()
        await never.wait()  # the user interrupts while this call is out
        raise AssertionError("unreachable")

    async with Engine.open(Settings.load(), provider=ScriptedProvider(script)) as engine:
        task = asyncio.create_task(engine.turn("h", "print 1 then wait"))
        await second.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        run = list_runs(engine.store, "h")[0]
        report = await replay(engine.store, run.run_id)
        trace = load_run(engine.store, run.run_id)
    events, calls = trace.events, trace.calls
    assert run.turn.status == "interrupted"
    # The call the interruption cut is kept (call 2: its request, nothing streamed).
    assert [e.kind for e in events] == ["interrupted"] and events[0].after_call == 2
    assert calls[1].streamed is not None and calls[1].streamed.parts == []
    assert report.identical and report.replayed_stop == "interrupted", report.render()


async def test_live_tools_report_where_results_differ():
    counter = itertools.count(1)

    @tool
    def tick(ctx: ToolContext) -> str:
        """Count up."""
        return f"tick {next(counter)}"

    registry = ToolRegistry([tick])
    provider = ScriptedProvider(
        [Reply([ToolCall("t1", "tick", {})], "tool"), Reply([Text("ticked")], "done")]
    )
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        result = await engine.turn("live", "tick once")
        served = await replay(engine.store, result.run_id, registry=registry)
        live = await replay(engine.store, result.run_id, registry=registry, live_tools=True)
    assert served.identical
    assert [(d.name, d.recorded, d.now) for d in live.tool_differences] == [
        ("tick", "tick 1", "tick 2")
    ]
    assert live.first is not None and live.first[0] == 2  # the new result shows in request 2


async def test_a_one_shot_runs_cell_replays_identically_with_live_tools():
    """`heron run` (one message, then the process ends) tells the model with its first cell's
    result that the kernel ends with the turn; the live replay ran the cell in a kernel that
    said nothing of it, so a deterministic cell was reported as a difference (exit 1)."""
    for message in ("compute 6*7 in python", "and again"):  # two processes, one each
        provider = ScriptedProvider(
            [_tool_call("c1", "x = 6 * 7\nprint(x)"), Reply([Text("42.")], "done", Usage(120, 5))]
        )
        async with Engine.open(Settings.load(), provider=provider, one_shot=True) as engine:
            result = await engine.turn("one", message)
            (call,) = load_run(engine.store, result.run_id).tools
            live = await replay(engine.store, result.run_id, live_tools=True)
        assert "this kernel ends with this turn" in (call.result or "")
        assert live.tool_differences == [] and live.identical, live.render()
    # the second process's cell was also told the first one's variables are gone
    assert "earlier variables are gone" in (call.result or "")


async def test_a_run_without_tools_replays_without_them():
    """The tiny offline model runs with no tools: its replay must not offer the default ones
    (which would change the system prompt and every request)."""
    provider = ScriptedProvider([Reply([Text("Hello!")], "done", Usage(50, 3))])
    async with Engine.open(Settings.load(), provider=provider, registry=ToolRegistry([])) as engine:
        await engine.turn("t", "say hello")
        (run,) = list_runs(engine.store, "t")
        report = await replay(engine.store, run.run_id)
    assert report.identical, report.render()
    assert report.replayed_requests == 1 and report.replayed_stop == "done"
    assert provider.requests[0].tools == []


async def test_a_run_with_the_proactive_tools_replays_with_them():
    """Every process that runs a person's turns attaches spawn, ask_user and goal
    (heron/proactive/wiring.py): `heron trace replay` rebuilds that list, in that order. The
    tests above record on a bare engine, which is how the replay once lost them."""
    provider = ScriptedProvider([Reply([Text("Hi.")], "done", Usage(50, 3))])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        loop = AgentLoop(engine, MessageBus())
        proactive = wiring.attach(loop)
        try:
            result = await engine.turn("w", "just a plain message")
        finally:
            await proactive.close()
            await loop.close()
        run = load_run(engine.store, result.run_id)
        report = await replay(engine.store, result.run_id, registry=wiring.replay_registry())
        bare = await replay(engine.store, result.run_id)  # the engine's tools only
    recorded = [t["name"] for t in run.start["prompt_inputs"]["tools"]]
    assert recorded[-3:] == ["spawn", "ask_user", "goal"]
    assert recorded == wiring.replay_registry().names()
    assert report.identical, report.render()
    assert not bare.identical
    assert "the run had tools the replay does not: spawn, ask_user, goal" in bare.render()


async def test_recorded_tools_compare_the_rest_of_a_run_whose_tools_changed_since():
    """After an upgrade every old run's requests differ at the tools; `--recorded-tools` sends
    them as the run described them, so a change elsewhere still shows, and nothing else does."""

    @tool
    def tick(ctx: ToolContext) -> str:
        """Count up."""
        return "tick"

    @tool(name="tick")
    def tick_now(ctx: ToolContext) -> str:
        """Count up by one, as this newer Heron describes it."""
        return "tick"

    provider = ScriptedProvider(
        [Reply([ToolCall("t1", "tick", {})], "tool"), Reply([Text("ticked")], "done")]
    )
    registry = ToolRegistry([tick])
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        result = await engine.turn("up", "tick once")
        upgraded = ToolRegistry([tick_now])
        today = await replay(engine.store, result.run_id, registry=upgraded)
        as_recorded = await replay(
            engine.store, result.run_id, registry=upgraded, recorded_tools=True
        )
    assert today.first is not None and today.first[0] == 1  # the tools, at the first request
    assert as_recorded.identical, as_recorded.render()
    assert as_recorded.replayed_requests == 2
