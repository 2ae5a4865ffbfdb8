"""How big a trace is: a scripted N-turn conversation (default 200) through the engine, then
the bytes its trace takes against the bytes of the conversation's own messages, the bytes a
full copy of every request would take, and a check that every recorded payload rebuilds byte for
byte.

    .venv/bin/python bench/trace_size.py [--turns 200] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from heron.messages import Reply, Text, ToolCall, Usage, dumps
from heron.request import ChatRequest
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool

WORDS = [
    "the",
    "of",
    "and",
    "a",
    "to",
    "in",
    "is",
    "you",
    "that",
    "it",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
]


def _text(seed: int, words: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 13) % len(WORDS)] + str(i % 10) for i in range(words))


@tool
def lookup(ctx: ToolContext, topic: str) -> str:
    """Look a topic up in the notes.

    Args:
        topic: What to look up.
    """
    return f"notes on {topic}: " + _text(len(topic), 80)


def script(request: ChatRequest) -> Reply:
    """Every third turn calls a tool first; every reply is a few sentences."""
    last = request.messages[-1]
    n = len(request.messages)
    if not request.tools:  # a summary or wrap-up request
        return Reply([Text("Summary: " + _text(n, 60))], "done", Usage(n * 40, 60))
    if last.role == "user" and not last.tool_results and n % 3 == 1:
        return Reply([ToolCall(f"call_{n}", "lookup", {"topic": f"topic {n}"})], "tool")
    return Reply([Text(_text(n, 50))], "done", Usage(n * 40, 50, cache_read=n * 30))


def _trace_bytes(store) -> dict[str, int]:
    q = lambda sql: int(store.query(sql)[0][0] or 0)  # noqa: E731
    return {
        "blobs": q("SELECT SUM(LENGTH(sha256) + LENGTH(kind) + LENGTH(body) + 8) FROM trace_blobs"),
        "nodes": 24 * q("SELECT COUNT(*) FROM trace_nodes"),
        "model_calls": q(
            "SELECT SUM(LENGTH(request) + IFNULL(LENGTH(request_ref), 0) + IFNULL(LENGTH(reply), 0)"
            " + IFNULL(LENGTH(error), 0) + LENGTH(purpose) + 72) FROM model_calls"
        ),
        "tool_calls": q(
            "SELECT SUM(LENGTH(call_id) + LENGTH(name) + LENGTH(args) + IFNULL(LENGTH(result), 0)"
            " + IFNULL(LENGTH(result_sha256), 0) + IFNULL(LENGTH(effects), 0) + 40) FROM tool_calls"
        ),
        "runs": q("SELECT SUM(LENGTH(start) + IFNULL(LENGTH(fingerprints), 0)) FROM trace_runs"),
        "events": q("SELECT SUM(IFNULL(LENGTH(body), 0) + 40) FROM trace_events"),
    }


def _pages(store, tables: list[str]) -> int:
    try:
        marks = ",".join("?" * len(tables))
        rows = store.query(
            f"SELECT SUM(pgsize) FROM dbstat WHERE name IN ({marks})"
            f" OR name IN (SELECT name FROM sqlite_master WHERE tbl_name IN ({marks}))",
            (*tables, *tables),
        )
        return int(rows[0][0] or 0)
    except Exception:  # SQLite built without dbstat
        return -1


async def run(turns: int) -> dict[str, object]:
    os.environ["HERON_HOME"] = tempfile.mkdtemp(prefix="heron-bench-")
    from heron.agent.engine import Engine
    from heron.config import Settings
    from heron.providers.scripted import ScriptedProvider
    from heron.trace.read import list_runs, load_run, request_payload

    provider = ScriptedProvider(script)
    started = time.perf_counter()
    async with Engine.open(
        Settings.load(), provider=provider, registry=ToolRegistry([lookup])
    ) as e:
        for i in range(turns):
            await e.turn("bench", f"Question {i}: " + _text(i, 30))
        elapsed = time.perf_counter() - started
        store = e.store
        sent = [dumps(provider.payload(r)) for r in provider.requests]
        runs = list(reversed(list_runs(store, "bench", limit=turns + 10)))
        t0 = time.perf_counter()
        recorded = [
            request_payload(store, c) for r in runs for c in load_run(store, r.run_id).calls
        ]
        rebuild_s = time.perf_counter() - t0
        messages = int(
            store.query("SELECT SUM(LENGTH(parts) + IFNULL(LENGTH(sent_parts), 0)) FROM messages")[
                0
            ][0]
        )
        parts = _trace_bytes(store)
        trace_tables = [
            "trace_blobs",
            "trace_nodes",
            "model_calls",
            "tool_calls",
            "trace_runs",
            "trace_events",
        ]
        pages = {"trace": _pages(store, trace_tables), "messages": _pages(store, ["messages"])}
    trace = sum(parts.values())
    return {
        "turns": turns,
        "requests": len(sent),
        "message_bytes": messages,
        "trace_bytes": trace,
        "ratio": round(trace / messages, 2),
        "full_copy_bytes": sum(len(p) for p in sent),
        "trace_parts": parts,
        "pages": pages,
        "rebuilt_identical": recorded == sent,
        "rebuild_all_s": round(rebuild_s, 2),
        "run_s": round(elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    r = asyncio.run(run(args.turns))
    if args.json:
        print(json.dumps(r))
        return
    print(f"{r['turns']} turns, {r['requests']} requests in {r['run_s']} s")
    print(f"conversation messages: {r['message_bytes']:>12,} bytes")
    print(f"trace:                 {r['trace_bytes']:>12,} bytes  ({r['ratio']}x the messages)")
    print(f"  by part: {r['trace_parts']}")
    print(
        f"full copy of requests: {r['full_copy_bytes']:>12,} bytes  (what storing each"
        " payload whole would take)"
    )
    pages = r["pages"]
    print(f"on disk (dbstat pages): trace {pages['trace']:,} bytes, messages {pages['messages']:,}")
    ok = "yes" if r["rebuilt_identical"] else "NO"
    print(f"every payload rebuilds byte for byte: {ok} (all rebuilt in {r['rebuild_all_s']} s)")
    if not r["rebuilt_identical"] or r["ratio"] >= 3:
        sys.exit(1)


if __name__ == "__main__":
    main()
