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


def test_an_unpriced_model_s_turn_costs_unknown_even_with_no_tokens():
    """A zero-token turn of a model with no price said `$0.0000` in `trace ls` while `heron
    run --json` said null for it (QA22x L4): unknown is `?` everywhere."""
    table = PriceTable()
    assert table.cost("fake-model", Usage()) is None
    assert table.known_cost("fake-model", Usage()) is None
    assert table.cost("gpt-4.1-mini", Usage()) == 0.0  # priced: no tokens cost nothing
    assert table.cost("fake-model", Usage(), provider="local") == 0.0


def test_a_negative_price_is_a_config_error(tmp_path):
    """`input = -1.0` was accepted and `heron usage` printed `$-0.0140` (QA22x L5)."""
    from heron.config import load_config

    path = tmp_path / "config.toml"
    path.write_text('[prices."mine*"]\ninput = -1.0\noutput = 2.0\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f'{path}:1: [prices."mine*"]: input is -1.0')
    assert "not be negative" in str(raised.value)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("input = nan", "input is nan; a price must be a finite number"),
        ("input = inf", "input is inf; a price must be a finite number"),
        ("input = 1e308", "input is 1e+308; a price above 1,000,000 dollars"),
        ('input = "2"', "input is '2'; a price must be a number, not a string"),
        ("input = true", "input is True; a price must be a number"),
    ],
)
def test_a_price_that_is_no_finite_number_is_a_config_error(tmp_path, line, said):
    """qa22v L2: `nan` made `heron run --json` print `"cost_usd": NaN` (not JSON), `1e308` a
    cost of `$inf`, and a string `"2"` was taken as 2 though a price must be a number."""
    from heron.config import load_config

    path = tmp_path / "config.toml"
    path.write_text(f'[prices."mine*"]\n{line}\noutput = 2.0\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f'{path}:1: [prices."mine*"]: {said}')


@pytest.mark.parametrize(
    "model",
    ["o4-mini-deep-research", "gpt-4o-mini-realtime-preview", "gpt-5-mini-search", "o3-pro"],
)
def test_a_price_glob_prices_its_model_and_snapshots_not_others_sharing_the_prefix(model):
    """`o4-mini*` priced any model whose name starts so (QA22x L12): a family's globs match
    the model and its dated snapshots only."""
    assert PriceTable().price(model) is None


def test_dated_snapshots_keep_their_family_price():
    table = PriceTable()
    for model, family in [
        ("o4-mini-2025-04-16", "o4-mini"),
        ("o3-2025-04-16", "o3"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4-0"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
    ]:
        assert table.price(model) == table.price(family) is not None, model


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
