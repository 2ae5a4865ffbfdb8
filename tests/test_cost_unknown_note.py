"""A cost of `?` says why, on stderr beside the listing, and how to give the model a price
(QA22u L10: `heron usage` and `trace` showed `?` with no word on `[prices."<glob>"]` or its
keys). stdout stays the table a script reads."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from heron.agent.engine import Engine, TurnHooks
from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.store.records import Turn
from heron.trace.prices import Price, PriceTable
from heron.trace.read import list_runs
from heron.trace.render import unknown_cost_notes

PRICE_NOTE = '[prices."scripted"] with input and output'


@pytest.mark.usefixtures("home_db")
async def test_usage_and_trace_say_how_to_price_a_model_whose_cost_is_unknown() -> None:
    provider = ScriptedProvider(lambda request: Reply([Text("hi")], "done", Usage(100, 5)))
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("k", "hello", TurnHooks())
        (summary,) = list_runs(engine.store, "k")
    for args in (
        ["usage"],
        ["trace", "ls"],
        ["trace", "show", summary.run_id],
        ["trace", "show", "k", "--stats"],
    ):
        said = CliRunner().invoke(app, args)
        assert said.exit_code == 0, said.output
        assert PRICE_NOTE in said.stderr and "US dollars per million tokens" in said.stderr, args
        assert "?" in said.stdout and "[prices." not in said.stdout, args
    priced = PriceTable((("scripted", Price(1.0, 2.0)),))
    assert unknown_cost_notes([summary.turn], priced) == []  # priced: nothing to say


def test_a_turn_stopped_mid_stream_is_said_apart_from_an_unknown_price() -> None:
    fields = {f.name: None for f in dataclasses.fields(Turn)}
    turn = Turn(**{**fields, "model": "gpt-4.1-mini", "provider": "openai", "usage_unknown": True})
    notes = unknown_cost_notes([turn], PriceTable())
    assert len(notes) == 1 and "stopped while a reply streamed" in notes[0]
    assert "[prices." not in notes[0]  # its price is known
