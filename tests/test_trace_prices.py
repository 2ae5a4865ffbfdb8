"""Prices and costs, and the `trace ls|show --stats` and `usage` commands."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.cli import app
from heron.config import Settings
from heron.errors import ConfigError
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.trace.prices import PriceTable, conversation_cost, format_cost, turn_cost


def test_cache_reads_and_writes_are_priced_apart_from_fresh_input():
    table = PriceTable()
    price = table.price("claude-sonnet-4-5-20250929")
    assert price is not None and price.input == 3.0
    # 1M input of which 600k cache read and 100k cache write; 100k output.
    cost = price.cost(Usage(1_000_000, 100_000, cache_read=600_000, cache_write=100_000))
    assert cost == pytest.approx(0.3 * 3.0 + 0.1 * 15.0 + 0.1 * 3.75 + 0.6 * 0.30)


def test_unknown_models_cost_none_and_config_overrides_win():
    table = PriceTable.from_config(
        {"my-*": {"input": 1, "output": 2}, "gpt-4.1*": {"input": 9, "output": 9}}
    )
    assert table.cost("mystery", Usage(10, 10)) is None and format_cost(None) == "?"
    assert table.cost("my-model", Usage(1_000_000, 0)) == pytest.approx(1.0)
    assert table.price("gpt-4.1-mini").input == 9  # the user's price beats the built-in one
    assert table.cost("anything", Usage(5, 5), provider="local") == 0.0
    with pytest.raises(ConfigError, match="input and output"):
        PriceTable.from_config({"x": {"input": 1}})


async def test_turn_and_conversation_costs_and_the_commands(home_db):  # on both backends
    provider = ScriptedProvider(
        [
            Reply([Text("a")], "done", Usage(1000, 100, cache_write=800)),
            Reply([Text("b")], "done", Usage(1200, 100, cache_read=800)),
        ],
        model="gpt-4.1-mini",
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("cost", "one")
        await engine.turn("cost", "two")
        turns = engine.store.turns(engine.store.conversation("cost").id)
    first = turn_cost(turns[0])
    # OpenAI charges cache writes as fresh input: (200 + 800) at 0.40, 100 out at 1.60.
    assert first == pytest.approx((1000 * 0.4 + 100 * 1.6) / 1e6)
    assert conversation_cost(turns) == pytest.approx(first + turn_cost(turns[1]))
    cli = CliRunner()
    ls = cli.invoke(app, ["trace", "ls", "--conversation", "cost"])
    assert (
        ls.exit_code == 0 and turns[1].run_id in ls.stdout.splitlines()[1]
    )  # newest, under the header
    stats = cli.invoke(app, ["trace", "show", "cost", "--stats"])
    assert stats.exit_code == 0 and "36%" in stats.stdout  # 800 of 2,200 input tokens cached
    assert format_cost(conversation_cost(turns)) in stats.stdout
    usage = cli.invoke(app, ["usage"])
    assert usage.exit_code == 0 and "scripted/gpt-4.1-mini" in usage.stdout
    shown = cli.invoke(app, ["trace", "show", turns[0].run_id[:12]])
    assert shown.exit_code == 0 and "you: one" in shown.stdout and "agent: a" in shown.stdout
    missing = cli.invoke(app, ["trace", "show", "run_nope"])
    assert missing.exit_code == 1 and "heron trace ls" in missing.stderr
    # a conversation's key where a run id goes: said so, with the two commands that take it
    by_key = cli.invoke(app, ["trace", "show", "cost"])
    assert by_key.exit_code == 1 and "'cost' is a conversation, not a run" in by_key.stderr
    assert "heron trace show cost --stats" in by_key.stderr
    assert "heron trace ls -c cost" in by_key.stderr
