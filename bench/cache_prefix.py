"""How much of each request a provider's prompt cache could serve, over a long conversation.

A scripted 200-turn conversation (read_file of 20 KB files, run_cell output, one long turn that
writes many files) runs through Heron's engine and the OpenAI-compatible adapter to the fake
server on loopback, which logs every request body. The window is forced small
(HERON_CONTEXT_WINDOW) so the run goes through consolidations and an in-flight compaction.

Figures, over the serialized requests (tools, then messages with the system first), in tokens of
Heron's offline estimate:
  cacheable fraction  sum of each request's longest common prefix with the previous request,
                      over the sum of request sizes;
  ideal fraction      the same if only content new to a request were uncached;
  prefix breaks       every request that does not start with the whole previous one, and why;
  effective tokens    mean input cost per request at Anthropic's weights (cached prefix read at
                      0.1x, the rest written at 1.25x);
  fixed prefix        tool schemas plus system prompt with the built-in tools, before history.

With `--wire anthropic` the same conversation goes through the Anthropic adapter to its fake
server, and the requests are also run through a block-level model of Anthropic's prompt cache
(heron/testing/anthropic_cache.py: entries only at the request's cache_control breakpoints, a
lookup at most 20 blocks back from each): it prints the tokens read, written and uncached, and
the effective tokens at Anthropic's weights (read 0.1x, written 1.25x, uncached 1x). Every
PARALLEL_EVERY-th turn the model writes PARALLEL_CALLS notes in one reply (24 blocks).

    .venv/bin/python bench/cache_prefix.py [--turns N] [--window N] [--wire anthropic] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from heron.context.tokens import estimate_text
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply, common_prefix

LONG_TURN = 120  # the turn that writes many files and is compacted in flight
LONG_TURN_CALLS = 40
PARALLEL_EVERY = 10  # turn 7, 17, 27...: one reply with PARALLEL_CALLS write_file calls
PARALLEL_CALLS = 12
FILE_KB = 20
SERVED: Counter[int] = Counter()  # model calls answered per turn
# What each turn does, by turn number modulo 6: a 20 KB read, a grep, a chat answer, run_cell
# output with a follow-up read, a file listing, a chat answer.
PLAN: list[list[tuple[str, dict[str, str]]]] = [
    [("read_file", {"path": "file_{n}.txt"})],
    [("grep", {"pattern": "file {n}$"})],
    [],
    [("run_cell", {"code": "summarize({n})"}), ("read_file", {"path": "file_{n}.txt"})],
    [("list_files", {"path": "."})],
    [],
]


# ---- the scripted model ----------------------------------------------------------------------


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else json.dumps(content)


def _turn_of(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(turn number, tool calls made so far in this turn) from a chat completions body."""
    calls = 0
    for m in reversed(messages):
        if m["role"] == "assistant":
            calls += len(m.get("tool_calls") or [])
        if m["role"] == "user" and _text(m).startswith("turn "):
            return int(_text(m).split()[1].rstrip(":")), calls
    return 0, calls


def _kind(body: dict[str, Any]) -> str:
    messages = body["messages"]
    system = _text(messages[0]) if messages and messages[0]["role"] == "system" else ""
    if system.startswith("You compact"):
        return "summary"
    if system.startswith(("You help keep the user's memory", "You tidy the user's memory")):
        return "memory"
    if system.startswith("You write checkpoints") or "[Heron: this turn is filling" in _text(
        messages[-1]
    ):
        return "checkpoint"
    return "turn"


def answer(body: dict[str, Any]) -> ServerReply:
    kind = _kind(body)
    if kind == "summary":
        return ServerReply(
            text="## Facts\nThe user is reviewing report files and notebooks.\n"
            "## Working state\nReviewing files one by one; next: the following file."
        )
    if kind == "memory":  # the extraction pass at a fold: nothing worth keeping
        return ServerReply(text='{"facts": []}')
    if kind == "checkpoint":
        return ServerReply(
            text="## Request\nWrite the module files.\n## User's instructions (quoted)\n"
            "see above\n## Done (with concrete paths, ids and values)\nwrote mod_*.py\n"
            "## Errors and dead ends\nnone\n## Open items\nthe rest\n## Current step\nwriting"
        )
    turn, _ = _turn_of(body["messages"])
    # Counted here, not from the messages: an in-flight compaction folds the turn's calls.
    calls = SERVED[turn]
    SERVED[turn] += 1
    if turn == LONG_TURN and calls < LONG_TURN_CALLS:
        content = f"# module {calls}\n" + "def f():\n    return 42\n" * 160
        return ServerReply(
            tool_calls=[("write_file", {"path": f"mod_{calls}.py", "content": content})]
        )
    if turn % PARALLEL_EVERY == PARALLEL_EVERY - 3 and calls == 0:
        # Writes: results micro-compaction leaves alone, so the turn's own cost shows.
        notes = [
            ("write_file", {"path": f"note_{turn}_{i}.txt", "content": f"note {i}"})
            for i in range(PARALLEL_CALLS)
        ]
        return ServerReply(tool_calls=notes)
    if turn != LONG_TURN and calls < len(PLAN[turn % len(PLAN)]):
        name, args = PLAN[turn % len(PLAN)][calls]
        return ServerReply(tool_calls=[(name, {k: v.format(n=turn % 12) for k, v in args.items()})])
    return ServerReply(text=f"Done with turn {turn}: the file looks consistent.")


def as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages API body as the chat-completions shape `answer` reads (system first, text
    joined, tool_use blocks as tool_calls)."""
    system = " ".join(b["text"] for b in body.get("system") or [])
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for m in body["messages"]:
        blocks = m["content"]
        text = "\n\n".join(b["text"] for b in blocks if b["type"] == "text")
        calls = [b for b in blocks if b["type"] == "tool_use"]
        for b in blocks:
            if b["type"] == "tool_result":
                messages.append({"role": "tool", "content": b["content"]})
        messages.append({"role": m["role"], "content": text, "tool_calls": calls or None})
    return {"messages": messages, "tools": body.get("tools", [])}


def answer_anthropic(body: dict[str, Any]) -> ServerReply:
    return answer(as_chat(body))


def block_cache_figures(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The requests, in order, through the block-level model of Anthropic's prompt cache."""
    from heron.testing.anthropic_cache import BlockCache

    cache = BlockCache()
    uses = [cache.use(body) for body in requests]
    read = sum(u.read for u in uses)
    written = sum(u.written for u in uses)
    uncached = sum(u.uncached for u in uses)
    total = read + written + uncached
    return {
        "block_read_fraction": read / total,
        "block_written_fraction": written / total,
        "block_effective_tokens_per_request": (read * 0.1 + written * 1.25 + uncached) / len(uses),
        "block_full_misses": sum(1 for u in uses[1:] if u.read == 0),
        "breakpoints_max": max(u.breakpoints for u in uses),
    }


# ---- the run ---------------------------------------------------------------------------------


def _registry() -> Any:
    """The built-in tools, with run_cell answering from a stub (same schema) so the benchmark
    does not start a Python kernel per turn."""
    from heron.tools.builtin import default_registry
    from heron.tools.python_kernel import run_cell
    from heron.tools.registry import ToolRegistry

    def fake_run_cell(ctx: Any, code: str, timeout: float = 60) -> str:
        return "\n".join(f"[{i}] value={i * 17 % 97} ok" for i in range(400))

    tools = default_registry()
    specs = [tools.get(n) for n in tools.names()]
    stub = dataclasses.replace(run_cell, fn=fake_run_cell)
    return ToolRegistry([stub if t.name == "run_cell" else t for t in specs])


async def run(turns: int, window: int, home: Path, base_url: str, wire: str) -> dict[str, Any]:
    from heron.agent.engine import Engine
    from heron.config import Settings
    from heron.store import compactions as folds

    env = {"HERON_HOME": str(home), "HERON_CONTEXT_WINDOW": str(window)}
    # A 40-call turn sends far more than the default per-run token ceiling (1M).
    config = "[agent]\nmax_tokens_total = 10000000\n"
    if wire == "anthropic":
        env["ANTHROPIC_API_KEY"] = "sk-ant-bench-fake"
        config = f'model = "claude-sonnet-4-5"\n{config}[providers.anthropic]\n'
        config += f'base_url = "{base_url}"\n'
    else:
        env.update({"HERON_BASE_URL": base_url, "HERON_MODEL": "fake-model"})
    (home / "config.toml").write_text(config)
    settings = Settings.load(env)
    async with Engine.open(settings, registry=_registry()) as engine:
        workspace = settings.paths.workspace
        line = "Quarterly figures: revenue, costs, margins and notes for review.\n"
        for i in range(12):
            (workspace / f"file_{i}.txt").write_text(
                f"file {i}\n" + line * (FILE_KB * 1024 // len(line))
            )
        for turn in range(1, turns + 1):
            await engine.turn("bench", f"turn {turn}: please look at the next file")
        conv = engine.store.conversation("bench")
        kinds = Counter(c.kind for c in folds.compactions(engine.store, conv.id))
        return {"compactions": dict(kinds)}


def fixed_prefix_tokens() -> int:
    """Tools plus system prompt, as the OpenAI-compatible adapter sends them, with no history."""
    from heron.context.prompt import PromptInputs, build_system_prompt
    from heron.providers.openai_compat import OpenAICompatProvider
    from heron.request import ChatRequest
    from heron.tools.builtin import default_registry

    specs = default_registry().specs()
    with tempfile.TemporaryDirectory() as empty:
        system = build_system_prompt(PromptInputs("default", Path(empty), specs))
    body = OpenAICompatProvider("m", "k").payload(ChatRequest("m", system, [], specs))
    return estimate_text(_serialize(body))


# ---- measuring -------------------------------------------------------------------------------


def _serialize(body: dict[str, Any]) -> str:
    """Tools, then each message in order, with no closing bracket: a request that only
    appends messages then starts with the whole previous one."""
    tools = json.dumps(body.get("tools", []), ensure_ascii=False)
    return tools + "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in body["messages"])


def _cause(prev: dict[str, Any], body: dict[str, Any], at: int) -> str:
    kind, before = _kind(body), _kind(prev)
    if kind == "summary":
        return "consolidation: the summary call"
    if kind == "memory":
        return "consolidation: memory's extraction call (a request of its own)"
    if before in ("summary", "memory"):
        return "consolidation: older turns folded into the summary"
    if before == "checkpoint":
        return "in-flight compaction: steps folded into the checkpoint"
    if kind == "checkpoint":
        return "in-flight compaction: checkpoint request"
    tools = json.dumps(body.get("tools", []), ensure_ascii=False)
    if at < len(tools):
        return "tool schemas changed"
    if body["messages"][0] != prev["messages"][0]:
        return "system prompt changed"
    changed = [m for m, p in zip(body["messages"], prev["messages"], strict=False) if m != p]
    if changed and "cleared from the context" in _text(changed[0]):
        return "micro-compaction: ten old results became placeholders"
    return "other"


def measure(requests: list[dict[str, Any]]) -> dict[str, Any]:
    sizes, cached, ideal, events = [], [], [], set()
    breaks = []
    prev_text, prev = "", None
    prev_messages: Counter[str] = Counter()
    for i, body in enumerate(requests):
        text = _serialize(body)
        size = estimate_text(text)
        common = common_prefix(prev_text, text) if prev is not None else 0
        hit = estimate_text(text[:common]) if common else 0
        messages = Counter(json.dumps(m, ensure_ascii=False) for m in body["messages"])
        new = sum(estimate_text(m) * n for m, n in (messages - prev_messages).items())
        tools_new = 0 if prev is not None and body.get("tools") == prev.get("tools") else None
        fresh = new + (estimate_text(json.dumps(body.get("tools", []))) if tools_new is None else 0)
        sizes.append(size)
        cached.append(hit)
        ideal.append(max(0, size - fresh))
        if prev is not None and common < len(prev_text):
            cause = _cause(prev, body, common)
            breaks.append({"request": i, "cause": cause})
            if cause.startswith(("consolidation", "in-flight")):
                events.add(i)
        if _kind(body) != "turn":
            events.update({i, i + 1})
        prev_text, prev, prev_messages = text, body, messages
    outside = [i for i in range(len(requests)) if i not in events and i > 0]
    return {
        "cacheable_fraction": sum(cached) / sum(sizes),
        "ideal_fraction": sum(ideal) / sum(sizes),
        "cacheable_outside_compaction": sum(cached[i] for i in outside)
        / max(1, sum(sizes[i] for i in outside)),
        "ideal_outside_compaction": sum(ideal[i] for i in outside)
        / max(1, sum(sizes[i] for i in outside)),
        "prefix_breaks": breaks,
        "effective_tokens_per_request": sum(
            c * 0.1 + (s - c) * 1.25 for c, s in zip(cached, sizes, strict=True)
        )
        / len(sizes),
        "mean_request_tokens": sum(sizes) / len(sizes),
        "requests": len(requests),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--window", type=int, default=64_000)
    parser.add_argument("--wire", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "HERON_BASE_URL", "HERON_MODEL"):
        os.environ.pop(var, None)
    anthropic = args.wire == "anthropic"
    fake = FakeAnthropicServer(answer_anthropic) if anthropic else FakeOpenAIServer(answer)
    with tempfile.TemporaryDirectory() as home, fake as server:
        url = server.base_url
        info = asyncio.run(run(args.turns, args.window, Path(home), url, args.wire))
        requests = [as_chat(b) for b in server.requests] if anthropic else server.requests
        figures = measure(requests)
        if anthropic:
            figures.update(block_cache_figures(server.requests))
    figures["fixed_prefix_tokens"] = fixed_prefix_tokens()
    figures["compactions"] = info["compactions"]
    figures["seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        keys = [
            "cacheable_fraction",
            "ideal_fraction",
            "prefix_breaks",
            "effective_tokens_per_request",
            "fixed_prefix_tokens",
        ]
        extra = ["cacheable_outside_compaction", "ideal_outside_compaction", "compactions"]
        extra += [k for k in figures if k.startswith(("block_", "breakpoints"))]
        print(json.dumps({k: figures[k] for k in keys + extra + ["requests"]}))
        return
    print(
        f"{args.turns} turns, window {args.window} tokens, {figures['requests']} requests "
        f"in {figures['seconds']} s; compactions: {figures['compactions']}"
    )
    print(f"cacheable fraction      {figures['cacheable_fraction']:.3f}")
    print(f"ideal fraction          {figures['ideal_fraction']:.3f}")
    print(
        f"  outside compaction    {figures['cacheable_outside_compaction']:.3f} "
        f"(ideal {figures['ideal_outside_compaction']:.3f})"
    )
    effective = figures["effective_tokens_per_request"]
    print(
        f"effective tokens/request (Anthropic weights) {effective:.0f}"
        f" of {figures['mean_request_tokens']:.0f} sent"
    )
    print(f"fixed prefix tokens     {figures['fixed_prefix_tokens']}")
    if anthropic:
        print(
            f"block-level cache (Anthropic's rules): read {figures['block_read_fraction']:.3f},"
            f" written {figures['block_written_fraction']:.3f}, effective tokens/request "
            f"{figures['block_effective_tokens_per_request']:.0f}, requests reading nothing "
            f"{figures['block_full_misses']}, breakpoints at most {figures['breakpoints_max']}"
        )
    print(f"prefix breaks           {len(figures['prefix_breaks'])}")
    for b in figures["prefix_breaks"]:
        print(f"  request {b['request']:5}: {b['cause']}")


if __name__ == "__main__":
    main()
