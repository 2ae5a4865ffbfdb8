"""The window invariant as a property: for random conversations (user messages from 1 byte to
5 MB, tool results up to 1 MB, random memory, a summarizer that fails or writes junk at random),
no request ever exceeds the window, every turn is answered, and every user message is either
verbatim in the last request or reachable from a pointer in it by recall_history.

A few examples run by default (seconds); `pytest -m slow` runs the heavier profile."""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from pathlib import Path

import pytest
from compaction_helpers import all_text, is_checkpoint, is_summary, reachable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strength import examples

from heron.agent.engine import Engine
from heron.config import Settings
from heron.context.tokens import Calibration, estimate_request
from heron.errors import TransientProviderError
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.tools.builtin import default_registry
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool

SIZES = st.one_of(
    st.integers(1, 3_000),
    st.integers(1, 3_000),
    st.integers(1, 3_000),
    st.sampled_from([40_000, 300_000, 5_000_000]),
)
TURN = st.tuples(SIZES, st.sampled_from([0, 0, 1, 2]), st.integers(0, 1_000_000))
MEMORY = st.lists(
    st.tuples(st.sampled_from(["always", "when"]), st.sampled_from([20, 900, 30_000, 1_000_000])),
    max_size=4,
)


@tool
def dump(ctx: ToolContext, size: int) -> str:
    """Print `size` bytes of a log.

    Args:
        size: how many bytes.
    """
    line = "log line with some words in it, number {i}\n"
    out = "".join(line.format(i=i) for i in range(size // 40 + 1))
    return out[:size]


def _registry() -> ToolRegistry:
    tools = default_registry()
    return ToolRegistry([*(tools.get(n) for n in tools.names()), dump])


def _text(n: int, size: int) -> str:
    """A user message of `size` characters that starts with words of its own."""
    head = f"message {n} about topic{n * 7919 % 10007} and item{n}: "
    body = "".join(f"word{(n * 31 + i) % 997} " for i in range(size // 8 + 1))
    return (head + body)[: max(size, 1)] if size > len(head) else head.strip()[:size] or "x"


class Model:
    """Tool rounds as scripted per turn; a summarizer that fails or writes junk at random;
    usage reports the request's own estimate, so calibration stays honest."""

    def __init__(self, rounds: dict[str, tuple[int, int]], seed: int, fail: float) -> None:
        self.rounds = rounds  # user text -> (tool calls, result size)
        self.rng = random.Random(seed)
        self.fail = fail
        self.requests: list[ChatRequest] = []
        self.turn_requests: list[ChatRequest] = []
        self.done: dict[str, int] = {}

    def __call__(self, request: ChatRequest) -> Reply:
        self.requests.append(request)
        usage = Usage(_estimate(request), 5)
        if is_summary(request):
            if self.rng.random() < self.fail:
                raise TransientProviderError("summarizer down")
            junk = "## Facts\n" + "blah " * self.rng.choice([5, 50_000])
            return Reply([Text(junk)], "done", usage)
        if is_checkpoint(request) or not request.tools:
            return Reply([Text("## Request\nsomething\n## Current step\nthis")], "done", usage)
        if request.system.startswith("You help keep") or request.system.startswith("You tidy"):
            return Reply([Text('{"facts": []}')], "done", usage)
        self.turn_requests.append(request)
        key = _turn_key(request)
        calls, size = self.rounds.get(key, (0, 0))
        n = self.done.get(key, 0)
        if n < calls:
            self.done[key] = n + 1
            call = ToolCall(f"d{len(self.requests)}", "dump", {"size": size})
            return Reply([call], "tool", usage)
        return Reply([Text("noted")], "done", usage)


def _turn_key(request: ChatRequest) -> str:
    for m in reversed(request.messages):
        if m.role == "user" and not m.tool_results and m.parts:
            return getattr(m.parts[0], "text", "")[:40]
    return ""


def _estimate(request: ChatRequest) -> int:
    return estimate_request(request.system, request.tools, request.messages, Calibration()).total


def _write_memory(memory: Path, entries: list[tuple[str, int]]) -> None:
    for i, (kind, size) in enumerate(entries):
        folder = memory / "personal" / kind / ("topic" if kind == "when" else "")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"entry-{i}.md").write_text(f"Entry {i}: " + "remember this " * (size // 14))


async def _conversation(window: int, turns, memory, fail: float, seed: int) -> None:
    with tempfile.TemporaryDirectory() as home:
        os.environ["HERON_HOME"] = home
        os.environ["HERON_CONTEXT_WINDOW"] = str(window)
        texts = [_text(n, size) for n, (size, _, _) in enumerate(turns)]
        texts.append("final question: are we still fine?")
        rounds = {t[:40]: (calls, size) for t, (_, calls, size) in zip(texts, turns, strict=False)}
        model = Model(rounds, seed, fail)
        settings = Settings.load()
        _write_memory(settings.paths.memory, memory)
        async with Engine.open(
            settings, provider=ScriptedProvider(model), registry=_registry()
        ) as engine:
            for text in texts:  # every turn is answered: none is refused or stuck
                result = await engine.turn("p", text)
                assert result.ok, result.reply
            reserve = min(8192, max(256, window // 4))
            for request in model.requests:  # the hard invariant, for every request sent
                assert _estimate(request) + reserve <= window, _estimate(request)
            last = model.turn_requests[-1]
            assert _turn_key(last) == texts[-1][:40]  # the conversation is not stuck
            seen = all_text(last)
            conv = engine.store.conversation("p")
            lost = [t[:60] for t in texts if not reachable(seen, engine.store, conv.id, t)]
            assert lost == []


def _check(window: int, turns, memory, fail: float, seed: int) -> None:
    saved = {k: os.environ.get(k) for k in ("HERON_HOME", "HERON_CONTEXT_WINDOW")}
    try:
        asyncio.run(_conversation(window, turns, memory, fail, seed))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


CASES = dict(
    window=st.sampled_from([8_000, 16_000, 64_000]),
    turns=st.lists(TURN, min_size=1, max_size=10),
    memory=MEMORY,
    fail=st.sampled_from([0.0, 0.5, 1.0]),
    seed=st.integers(0, 1000),
)


@settings(max_examples=examples(5, 2), deadline=None, suppress_health_check=list(HealthCheck))
@given(**CASES)
def test_no_request_exceeds_the_window_and_every_user_message_stays_reachable(
    window, turns, memory, fail, seed
):
    _check(window, turns, memory, fail, seed)


@pytest.mark.heavy
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(**{**CASES, "turns": st.lists(TURN, min_size=10, max_size=60)})
def test_the_invariant_holds_over_long_random_conversations(window, turns, memory, fail, seed):
    _check(window, turns, memory, fail, seed)
