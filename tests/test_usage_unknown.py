"""Calls billed but never counted: a stream cut after it began (and retried), a server that
sends no usage chunk. Their usage is unknown, so the turn's cost is `?`, never $0.0000, and
every attempt sent counts as a model call."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

from heron.agent.engine import Engine
from heron.channels.script import run_once
from heron.config import Settings
from heron.messages import Message, Text
from heron.providers.openai_compat import OpenAICompatProvider
from heron.request import ChatRequest
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
from heron.trace.prices import format_cost, turn_cost

PRICED = "gpt-4.1-mini"  # a model with a price: an unknown cost shows, it is not just unpriced
CUT = ServerReply(text="a partial reply that the proxy cuts", chunk_size=4, cut_after_events=4)


def _turn_row(settings: Settings, key: str):
    store = Store(settings.paths.ensure().db)
    try:
        conversation = store.open_conversation(key)
        return store.turns(conversation.id)[-1]
    finally:
        store.close()


async def test_a_stream_without_a_usage_chunk_has_its_usage_unknown():
    with FakeOpenAIServer([ServerReply(text="hello there", no_usage=True)]) as srv:
        provider = OpenAICompatProvider(PRICED, "key", base_url=srv.base_url)
        request = ChatRequest(PRICED, "", [Message("user", (Text("hi"),))])
        reply = await provider.chat(request)
        await provider.aclose()
    assert reply.text == "hello there"
    assert reply.usage_unknown
    assert reply.usage.output > 0  # what was read of it, a floor


async def test_a_cut_and_retried_call_counts_both_attempts_and_costs_unknown():
    settings = Settings.load()
    with FakeOpenAIServer([CUT, ServerReply(text="the whole reply")]) as srv:
        provider = OpenAICompatProvider(PRICED, "key", base_url=srv.base_url)
        async with Engine.open(settings, provider=provider) as engine:
            result = await engine.turn("cut", "hello")
    assert result.ok and result.reply == "the whole reply"
    assert result.run.model_calls == 2 and result.run.usage_unknown
    row = _turn_row(settings, "cut")
    assert row.model_calls == 2 and row.usage_unknown
    assert format_cost(turn_cost(row)) == "?"


async def _run_json(script: list[ServerReply], key: str) -> tuple[bool, dict[str, Any]]:
    """`heron run --json -c KEY hello` in this process against a fake server."""
    out, err = StringIO(), StringIO()
    with FakeOpenAIServer(script) as srv:
        provider = OpenAICompatProvider(PRICED, "key", base_url=srv.base_url)
        ok = await run_once(
            Settings.load(), "hello", "default", key, None, False, out, err, provider, as_json=True
        )
    return ok, json.loads(out.getvalue())


async def test_heron_run_json_says_cost_unknown_for_calls_cut_every_time():
    settings = Settings.load()
    ok, said = await _run_json([CUT] * 5, "cutall")
    assert not ok
    assert said["cost_usd"] is None  # unknown, not 0.0
    row = _turn_row(settings, "cutall")
    assert row.model_calls == 5 and row.usage_unknown
    assert format_cost(turn_cost(row)) == "?"


async def test_heron_run_json_says_cost_unknown_when_no_usage_came():
    settings = Settings.load()
    ok, said = await _run_json([ServerReply(text="hi", no_usage=True)], "nousage")
    assert ok
    assert said["cost_usd"] is None
    assert format_cost(turn_cost(_turn_row(settings, "nousage"))) == "?"
