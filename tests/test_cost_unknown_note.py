"""A cost of `?` says why under the listing, and how to give the model a price (QA22u L10:
`heron usage` and `trace` showed `?` with no word on `[prices."<glob>"]` or its keys)."""

from __future__ import annotations

import dataclasses

import pytest

from heron.agent.engine import Engine, TurnHooks
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.trace.prices import Price, PriceTable
from heron.trace.read import list_runs, load_run
from heron.trace.render import render_show, render_stats, render_usage, unknown_cost_notes

PRICE_NOTE = '[prices."scripted"] with input and output'


@pytest.mark.usefixtures("home_db")
async def test_usage_and_stats_say_how_to_price_a_model_whose_cost_is_unknown() -> None:
    provider = ScriptedProvider(lambda request: Reply([Text("hi")], "done", Usage(100, 5)))
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("k", "hello", TurnHooks())
        (summary,) = list_runs(engine.store, "k")
        unknown = PriceTable()
        priced = PriceTable((("scripted", Price(1.0, 2.0)),))
        said = {
            "usage": list(render_usage(engine.store, unknown, "UTC")),
            "stats": list(render_stats(engine.store, [summary.turn], unknown)),
            "show": list(
                render_show(engine.store, load_run(engine.store, summary.run_id), unknown, "UTC")
            ),
        }
        with_price = list(render_usage(engine.store, priced, "UTC"))
    for name, lines in said.items():
        assert any(PRICE_NOTE in line for line in lines), name
        assert any("US dollars per million tokens" in line for line in lines), name
    assert not any("?" in line for line in with_price)  # priced: no `?` and no note


def test_a_turn_stopped_mid_stream_is_said_apart_from_an_unknown_price() -> None:
    from heron.store.records import Turn

    fields = {f.name: None for f in dataclasses.fields(Turn)}
    turn = Turn(**{**fields, "model": "gpt-4.1-mini", "provider": "openai", "usage_unknown": True})
    notes = unknown_cost_notes([turn], PriceTable())
    assert len(notes) == 1 and "stopped while a reply streamed" in notes[0]
    assert "[prices." not in notes[0]  # its price is known
