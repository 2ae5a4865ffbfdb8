"""A long conversation in a small window: does it stay usable, bounded and linear?

500 turns (`--turns N` for fewer) through the engine and the OpenAI-compatible adapter to the
fake server on loopback, which enforces an 8,000-token window (it refuses a larger prompt, as a
real server does). Each turn the user writes a short message with a unique marker, the model
runs `bash` once (about 10 KB of output, from a stub with bash's schema) and answers.

Figures:
  over_window             requests the server refused for their size (target 0)
  largest_request_tokens  the largest request the server received, in its tokens
  consolidations_per_100  consolidations per 100 turns (target <= 10)
  verbatim_last           user messages quoted whole in the last request
  recall_found/_total     of the other user messages, how many `recall_history` finds by their
                          exact words (target: all)
  trace_ratio             trace bytes / message bytes (target < 3)
  db_mb                   the database's size (with its WAL)
  peak_rss_mb             the process's peak resident memory (target < 100)
  turn_ms_10/_500         median time of the turns around turn 10 and of the last turns

    .venv/bin/python bench/long_run.py [--turns 500] [--window 8000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trace_size import _trace_bytes

from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

OUTPUT_KB = 10
WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord"]
WORDS += ["garnet", "harbor", "indigo", "juniper", "kestrel", "lagoon"]


def user_text(turn: int) -> str:
    """A short message, unique by its marker and its words (recall looks for them)."""
    words = " ".join(WORDS[(turn * 7 + i * 5) % len(WORDS)] for i in range(12))
    return f"turn {turn}: marker-{turn}-q{turn * 31 % 997} please check the log, {words}"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else json.dumps(content)


def answer(body: dict[str, Any]) -> ServerReply:
    messages = body["messages"]
    system = _text(messages[0]) if messages and messages[0]["role"] == "system" else ""
    if system.startswith("You compact"):
        return ServerReply(
            text="## Facts\nThe user is checking build logs turn by turn.\n"
            "## Working state\nChecking logs; next: the following log."
        )
    if system.startswith(("You help keep the user's memory", "You tidy the user's memory")):
        return ServerReply(text='{"facts": []}')
    if system.startswith("You write checkpoints") or "[Heron: this turn is filling" in _text(
        messages[-1]
    ):
        return ServerReply(text="## Request\ncheck the log\n## Done\nran the command")
    if messages[-1]["role"] == "tool":
        return ServerReply(text="The log looks clean: no errors in this build.")
    return ServerReply(tool_calls=[("bash", {"command": "cat build.log"})])


def _registry() -> Any:
    """The built-in tools, with bash answering ~10 KB from a stub (same schema): no sandbox,
    no process per turn."""
    from heron.tools.builtin import default_registry
    from heron.tools.registry import ToolRegistry
    from heron.tools.shell import bash

    line = "build step {i:04d}: compiled module, 0 warnings, checksum {c:08x}\n"

    async def fake_bash(ctx: Any, command: str, timeout: int = 120) -> str:
        lines, i = [], 0
        while sum(map(len, lines)) < OUTPUT_KB * 1024:
            lines.append(line.format(i=i, c=i * 2654435761 % 2**32))
            i += 1
        return "".join(lines)

    tools = default_registry()
    specs = [tools.get(n) for n in tools.names()]
    stub = dataclasses.replace(bash, fn=fake_bash)
    return ToolRegistry([stub if t.name == "bash" else t for t in specs])


def _last_turn_request(fake: FakeOpenAIServer) -> dict[str, Any] | None:
    for body in reversed(fake.requests):
        messages = body.get("messages") or []
        system = _text(messages[0]) if messages else ""
        if not system.startswith(("You compact", "You help keep", "You tidy", "You write")):
            return body
    return None


async def run(turns: int, window: int, home: Path, fake: FakeOpenAIServer) -> dict[str, Any]:
    from heron.agent.engine import Engine
    from heron.config import Settings
    from heron.store import compactions as folds

    env = {
        "HERON_HOME": str(home),
        "HERON_BASE_URL": fake.base_url,
        "HERON_MODEL": "fake-model",
        "HERON_CONTEXT_WINDOW": str(window),
    }
    settings = Settings.load(env)
    times: list[float] = []
    last: dict[str, Any] | None = None
    async with Engine.open(settings, registry=_registry()) as engine:
        for turn in range(1, turns + 1):
            started = time.perf_counter()
            await engine.turn("bench", user_text(turn))
            times.append((time.perf_counter() - started) * 1000)
            with fake._lock:  # the server keeps every body: keep only the last turn's
                last = _last_turn_request(fake) or last
                fake.requests.clear()
                fake.headers.clear()
        store = engine.store
        conv = store.conversation("bench")
        assert conv is not None
        consolidations = sum(1 for c in folds.compactions(store, conv.id) if c.is_consolidation)
        sent = json.dumps(last, ensure_ascii=False) if last else ""
        verbatim = [t for t in range(1, turns + 1) if user_text(t) in sent]
        rest = [t for t in range(1, turns + 1) if t not in set(verbatim)]
        found = sum(1 for t in rest if _recalled(engine, store, conv.id, t))
        messages = int(
            store.query("SELECT SUM(LENGTH(parts) + IFNULL(LENGTH(sent_parts), 0)) FROM messages")[
                0
            ][0]
        )
        trace = sum(_trace_bytes(store).values())
    db = sum(p.stat().st_size for p in home.glob("heron.db*"))
    return {
        "over_window": fake.over_window,
        "largest_request_tokens": fake.largest_prompt,
        "consolidations_per_100": round(consolidations * 100 / turns, 1),
        "verbatim_last": len(verbatim),
        "recall_found": found,
        "recall_total": len(rest),
        "trace_ratio": round(trace / max(1, messages), 2),
        "db_mb": round(db / 1e6, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "turn_ms_10": round(statistics.median(times[5:15] or times), 1),
        "turn_ms_500": round(statistics.median(times[-10:]), 1),
    }


def _recalled(engine: Any, store: Any, conversation_id: int, turn: int) -> bool:
    """Whether recall finds the user's message of `turn` by its exact words."""
    text = user_text(turn)
    rows = store.query(
        "SELECT id FROM messages WHERE conversation_id = ? AND role = 'user' AND parts LIKE ?",
        (conversation_id, f"%marker-{turn}-q%"),
    )
    ids = {int(r[0]) for r in rows}
    hits = engine.recall.search(text, 8) if engine.recall is not None else []
    return any(h.message_id in ids for h in hits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--window", type=int, default=8_000)
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args()
    with FakeOpenAIServer(answer, window=args.window) as fake:
        home = Path(tempfile.mkdtemp(prefix="heron-long-run-"))
        r = asyncio.run(run(args.turns, args.window, home, fake))
    if args.json:
        print(json.dumps(r))
        return
    print(f"{args.turns} turns, window {args.window:,} tokens, ~{OUTPUT_KB} KB of output a turn")
    print(f"requests over the window:     {r['over_window']} (target 0)")
    print(f"largest request:              {r['largest_request_tokens']:,} tokens")
    print(f"consolidations per 100 turns: {r['consolidations_per_100']} (target <= 10)")
    print(f"user messages verbatim last:  {r['verbatim_last']}")
    print(f"recall finds the others:      {r['recall_found']} of {r['recall_total']}")
    print(f"trace / message bytes:        {r['trace_ratio']} (target < 3)")
    print(f"database:                     {r['db_mb']} MB")
    print(f"peak RSS:                     {r['peak_rss_mb']} MB (target < 100)")
    print(f"time per turn:                {r['turn_ms_10']} ms at turn 10, ", end="")
    print(f"{r['turn_ms_500']} ms at the end (target within 1.5x)")


if __name__ == "__main__":
    main()
