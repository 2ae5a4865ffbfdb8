"""A turn stopped mid-stream (/stop, Ctrl-C) keeps its model call in the trace: the exact
request body sent, what streamed, the usage if the provider sent any. Its usage is not all
known, so its cost is `?` in `trace ls`, `trace show`, `--stats` and `heron usage`, never
$0.0000 (the request was sent and the words that streamed were billed)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from heron.agent.engine import Engine, TurnHooks
from heron.agent.loop import AgentLoop
from heron.agent.replay import replay
from heron.bus import InboundMessage, MessageBus, TurnEvent
from heron.config import Settings
from heron.providers.anthropic import AnthropicProvider
from heron.providers.openai_compat import OpenAICompatProvider
from heron.request import StreamEvent
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
from heron.trace.prices import PriceTable, turn_cost
from heron.trace.read import list_runs, load_run, request_payload
from heron.trace.render import ls_rows, render_show, render_stats, render_usage

pytestmark = pytest.mark.usefixtures("home_db")

FULL = "The first words stream in. And then much more."
# The reply in pieces of 4 characters; a few come, then the model stalls.
STALLING = ServerReply(text=FULL, chunk_size=4, stall_after_events=8)


async def _delta_seen(bus: MessageBus) -> None:
    """Until the loop has streamed some answer text (a `delta` event on the bus)."""
    while True:
        event = await bus.outbound.get()
        if isinstance(event, TurnEvent) and event.kind == "delta" and event.text:
            return


def _shown(engine: Engine, run_id: str, prices: PriceTable) -> str:
    run = load_run(engine.store, run_id)
    return "\n".join(render_show(engine.store, run, prices, "UTC"))


async def test_a_stop_mid_stream_keeps_the_call_with_its_request_and_what_streamed() -> None:
    with FakeOpenAIServer([STALLING]) as server:
        provider = OpenAICompatProvider("gpt-4.1-mini", "dummy-key-123456", server.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            bus = MessageBus()
            loop = AgentLoop(engine, bus)
            await loop.dispatch(InboundMessage("t", "1", "explain", events=True))
            await asyncio.wait_for(_delta_seen(bus), 30)
            await loop.dispatch(InboundMessage("t", "1", "/stop"))
            await loop.wait_idle()
            await loop.close()
            (summary,) = list_runs(engine.store, "t:1")
            run = load_run(engine.store, summary.run_id)
            (call,) = run.calls
            payload = request_payload(engine.store, call)
            prices = PriceTable()
            shown = _shown(engine, summary.run_id, prices)
            stats = "\n".join(render_stats(engine.store, [summary.turn], prices))
            usage = "\n".join(render_usage(engine.store, prices, "UTC"))
            report = await replay(engine.store, summary.run_id)
            said = engine.store.branch(engine.store.conversation("t:1").id)[-1].message.text
    turn = summary.turn
    assert turn.status == "interrupted" and turn.model_calls == 1 and turn.usage_unknown
    assert json.loads(payload) == server.requests[0]  # the body the server received
    assert call.reply is None and call.streamed is not None
    streamed = call.streamed.parts[0].text
    assert streamed and FULL.startswith(streamed)  # as far as it came before the stop
    assert said.startswith(streamed.rstrip())  # the part of the reply the person read, kept
    assert call.streamed.usage is None  # an OpenAI stream says its usage only at its end
    # gpt-4.1-mini has a price, yet the cost is unknown: the output billed was never counted.
    assert turn_cost(turn, prices) is None
    # Unknown usage makes a cost unknown, except where every token costs nothing.
    assert turn_cost(dataclasses.replace(turn, provider="local"), prices) == 0.0
    assert ls_rows([summary], prices, "UTC")[0][-1] == "?"
    # as `trace show` prints text: white space folded (a stop may fall just after a space)
    assert f"streamed: {' '.join(streamed.split())}" in shown and " · ? · " in shown
    assert "$0.0000" not in shown + stats + usage
    assert stats.splitlines()[1].split()[-2] == "?"
    assert [line.split()[-1] for line in usage.splitlines() if line.startswith("total")] == [
        "?",
        "?",
    ]
    # The replay rebuilds the stopped request too, and stops where the run was stopped.
    assert report.identical and report.replayed_stop == "interrupted", report.render()


async def test_ctrl_c_mid_stream_keeps_the_usage_the_provider_sent() -> None:
    """Anthropic's stream opens with the input's usage: a call stopped after it keeps it."""
    seen = asyncio.Event()

    def on_event(event: StreamEvent) -> None:
        if event.kind == "text":
            seen.set()

    with FakeAnthropicServer([STALLING]) as server:
        provider = AnthropicProvider("claude-sonnet-4-5", "dummy-key-123456", server.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            task = asyncio.create_task(engine.turn("a", "explain", TurnHooks(on_event=on_event)))
            await asyncio.wait_for(seen.wait(), 30)
            task.cancel()  # what Ctrl-C does to a turn in this process
            with pytest.raises(asyncio.CancelledError):
                await task
            (summary,) = list_runs(engine.store, "a")
            (call,) = load_run(engine.store, summary.run_id).calls
            prices = PriceTable()
            shown = _shown(engine, summary.run_id, prices)
    assert call.streamed is not None and call.streamed.usage is not None
    assert call.streamed.usage.input > 0 and call.usage == call.streamed.usage
    assert summary.turn.usage.input == call.usage.input and summary.turn.usage_unknown
    assert turn_cost(summary.turn, prices) is None  # a known price, an unknown output
    assert "usage as the provider sent it" in shown


async def test_a_reply_cut_at_its_cap_before_the_server_counted_it_has_unknown_usage(
    monkeypatch,
) -> None:
    """An OpenAI-compatible stream says its usage last: a reply Heron cuts at its output cap
    never gets it, so the call's input is unknown (0 was recorded), and the turn says so as a
    stopped one does."""
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")  # an output cap of 2,000 tokens
    with FakeOpenAIServer([ServerReply(text="Start. ", endless="text")]) as server:
        provider = OpenAICompatProvider("gpt-4.1-mini", "dummy-key-123456", server.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            result = await engine.turn("cut", "write for ever")
            (summary,) = list_runs(engine.store, "cut")
            (call,) = load_run(engine.store, result.run_id).calls
            prices = PriceTable()
            shown = _shown(engine, result.run_id, prices)
    assert call.reply is not None and call.reply.stop == "length" and call.usage.input == 0
    assert summary.turn.usage_unknown and turn_cost(summary.turn, prices) is None
    assert " · ? · " in shown and "usage unknown: cut at its output cap" in shown
    assert ls_rows([summary], prices, "UTC")[0][-1] == "?"
    assert call.reply.usage_unknown  # read back from the trace
