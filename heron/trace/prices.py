"""What tokens cost: a price per model (input, output, cache write, cache read, in US dollars per
million tokens), overridable in config.toml:

    [prices."my-model*"]
    input = 0.5
    output = 1.5
    cache_read = 0.05
    cache_write = 0.6

An unknown price is None, never zero: a cost that cannot be computed is shown as "?". Models
served locally cost nothing.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from heron.config import price_values
from heron.messages import Usage

PER = 1_000_000
FREE_PROVIDERS = ("local",)


@dataclass(frozen=True)
class Price:
    input: float
    output: float
    cache_write: float | None = None  # None: writes cost what fresh input costs (OpenAI)
    cache_read: float | None = None  # None: no discount

    @property
    def free(self) -> bool:
        return not any((self.input, self.output, self.cache_write, self.cache_read))

    def cost(self, usage: Usage) -> float:
        """`usage.input` includes cache reads and writes (see heron.messages.Usage)."""
        fresh = max(usage.input - usage.cache_read - usage.cache_write, 0)
        write = self.input if self.cache_write is None else self.cache_write
        read = self.input if self.cache_read is None else self.cache_read
        return (
            fresh * self.input
            + usage.output * self.output
            + usage.cache_write * write
            + usage.cache_read * read
        ) / PER


def _family(name: str, price: Price, *aliases: str) -> dict[str, Price]:
    """A model's price under its name, its dated snapshots (`-2025-04-16`, `-20250929`) and
    its `aliases`: never under a bare prefix, which would price other models that share it
    (`o4-mini*` matched `o4-mini-deep-research`, a model with prices of its own)."""
    return {pattern: price for pattern in (name, f"{name}-20*", *aliases)}


# List prices (USD per million tokens) as published by the providers in late 2025
# (https://docs.anthropic.com/en/docs/about-claude/pricing, https://openai.com/api/pricing,
# https://api-docs.deepseek.com/quick_start/pricing). They change: override them in
# config.toml. Patterns are fnmatch globs over the lower-cased model name; the longest
# matching pattern wins. Sonnet's long-context rate (input over 200k tokens) is not here:
# it applies only with Anthropic's 1M-token beta, which Heron never asks for, so no request
# Heron sends is charged at it (docs/traces.md, "Prices").
BUILTIN: dict[str, Price] = {
    **_family("claude-opus-4-5", Price(5.0, 25.0, 6.25, 0.50)),
    **_family("claude-opus-4-1", Price(15.0, 75.0, 18.75, 1.50)),
    **_family("claude-opus-4", Price(15.0, 75.0, 18.75, 1.50), "claude-opus-4-0"),
    **_family("claude-sonnet-4-5", Price(3.0, 15.0, 3.75, 0.30)),
    **_family("claude-sonnet-4", Price(3.0, 15.0, 3.75, 0.30), "claude-sonnet-4-0"),
    **_family("claude-3-7-sonnet", Price(3.0, 15.0, 3.75, 0.30), "claude-3-7-sonnet-latest"),
    **_family("claude-haiku-4-5", Price(1.0, 5.0, 1.25, 0.10)),
    **_family("claude-3-5-haiku", Price(0.80, 4.0, 1.0, 0.08), "claude-3-5-haiku-latest"),
    **_family("gpt-5", Price(1.25, 10.0, None, 0.125)),
    **_family("gpt-5-mini", Price(0.25, 2.0, None, 0.025)),
    **_family("gpt-5-nano", Price(0.05, 0.40, None, 0.005)),
    **_family("gpt-4.1", Price(2.0, 8.0, None, 0.50)),
    **_family("gpt-4.1-mini", Price(0.40, 1.60, None, 0.10)),
    **_family("gpt-4.1-nano", Price(0.10, 0.40, None, 0.025)),
    **_family("gpt-4o", Price(2.50, 10.0, None, 1.25)),
    **_family("gpt-4o-mini", Price(0.15, 0.60, None, 0.075)),
    **_family("o3", Price(2.0, 8.0, None, 0.50)),
    **_family("o4-mini", Price(1.10, 4.40, None, 0.275)),
    "deepseek-chat": Price(0.28, 0.42, None, 0.028),
    "deepseek-reasoner": Price(0.28, 0.42, None, 0.028),
}


@dataclass(frozen=True)
class PriceTable:
    overrides: tuple[tuple[str, Price], ...] = ()

    @classmethod
    def from_config(cls, prices: Mapping[str, Any]) -> PriceTable:
        """From config.toml's [prices."<glob>"] tables; a malformed one is a ConfigError."""
        return cls(tuple((pattern.lower(), _price(pattern, t)) for pattern, t in prices.items()))

    def price(self, model: str | None, provider: str | None = None) -> Price | None:
        if provider in FREE_PROVIDERS:
            return Price(0.0, 0.0)
        if not model:
            return None
        name = model.lower()
        # A user's override beats the built-in list, whatever the pattern lengths.
        for table in (self.overrides, tuple(BUILTIN.items())):
            found = _best(name, table)
            if found is not None:
                return found
        return None

    def cost(
        self, model: str | None, usage: Usage, provider: str | None = None, *, known: bool = True
    ) -> float | None:
        """`known` False: `usage` is not all that was billed (a call stopped mid-stream), so
        the cost is unknown unless the model costs nothing."""
        if not known:
            price = self.price(model, provider)
            return 0.0 if price is not None and price.free else None
        price = self.price(model, provider)
        if price is None:
            return None  # unknown even for no tokens: one answer with `known_cost`
        return 0.0 if usage == Usage() else price.cost(usage)

    def known_cost(
        self, model: str | None, usage: Usage | None, provider: str | None = None
    ) -> float | None:
        """A turn's cost as `heron run --json` and the serve's turn_end report it: None
        whenever the model's price is unknown, even for a turn that spent no tokens."""
        return None if usage is None else self.cost(model, usage, provider)


def _best(name: str, table: Iterable[tuple[str, Price]]) -> Price | None:
    matches = [(len(p), price) for p, price in table if fnmatch.fnmatchcase(name, p)]
    return max(matches, key=lambda m: m[0])[1] if matches else None


def _price(pattern: str, table: Any) -> Price:
    return Price(**price_values(pattern, table))


def turn_cost(turn: Any, prices: PriceTable | None = None) -> float | None:
    """What one turn cost, or None when its model's price or its usage (a call stopped
    mid-stream) is unknown. `turn` is a store Turn."""
    known = not turn.usage_unknown
    return (prices or PriceTable()).cost(turn.model, turn.usage, turn.provider, known=known)


def conversation_cost(turns: Iterable[Any], prices: PriceTable | None = None) -> float | None:
    """The sum over a conversation's turns; None if any turn's price is unknown (a partial sum
    would understate it)."""
    total = 0.0
    for turn in turns:
        cost = turn_cost(turn, prices)
        if cost is None:
            return None
        total += cost
    return total


def format_cost(cost: float | None) -> str:
    if cost is None:
        return "?"
    return f"${cost:.4f}" if cost < 1 else f"${cost:.2f}"
