"""Where the time of one turn goes on PostgreSQL, against SQLite: one process, an instant model.

One engine (heron/agent/engine.py, the full tool registry, memory and recall as shipped) runs
C conversations x T turns one after the other (`Engine.turn`; no other turn overlaps, so each
statement's wait is the turn's own) against a scripted model that answers at once: every
second spent is Heron's or the database's. Every round trip to the server is counted and timed
where it leaves Heron (`PgConnection._send`, `_end` and `executemany`; a BEGIN is sent with the
transaction's first statement, so it is no round trip of its own: `begin_folded` counts those;
on SQLite `sqlite3`'s trace callback counts the statements Heron sends, not those its triggers
and FTS5 run, and they are not timed), by kind: a BEGIN sent alone, the COMMIT, the
conversation's row lock (docs/scale.md, "Across processes": its own statement in a claim, SAVE
and a checkpoint; an append's head read takes it in the same statement), the trace's advisory
lock, reads, writes and the caches' counters.

Per turn it prints: wall ms, CPU ms of this process, statements (round trips on PostgreSQL),
the ms spent waiting inside them, and each kind's count. The backends alternate (`--runs`
rounds of both, in the same period), each figure the median, each run with its load average.
A turn with a tool call (`--tool`) adds the tool phase: the assistant message, its checkpoint
and the second model call.

PostgreSQL is the server HERON_DATABASE_URL names (each run in a fresh schema: a tenant of its
own), else a throwaway one started as the tests start theirs (tests/pg.py).

    .venv/bin/python bench/pg_turn.py [--conversations 20 --turns 5 --runs 3 --tool] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

KINDS = ("begin", "commit", "row lock", "advisory", "read", "write", "counter")


def kind_of(sql: str) -> str:
    head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
    if head == "BEGIN":
        return "begin"
    if head in ("COMMIT", "ROLLBACK"):
        return "commit"
    if "FROM HERON_REWRITES" in sql.upper() or "FROM HERON_TRACE_GC" in sql.upper():
        return "counter"  # a cache's change counter (docs/scale.md, "Caches")
    if "PG_ADVISORY" in sql.upper():
        return "advisory"  # the trace's check against its garbage collection
    if "FOR NO KEY UPDATE" in sql.upper():
        return "row lock"  # the conversation's: a lease claim, SAVE, a checkpoint, an append
    if head in ("SELECT", "WITH", "PRAGMA"):
        return "read"
    return "write"


class Tally:
    """Statements by kind and the seconds spent inside them."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.seconds = 0.0

    def add(self, kind: str, seconds: float = 0.0) -> None:
        self.kinds[kind] += 1
        self.seconds += seconds


@contextmanager
def counting_postgres(tally: Tally) -> Iterator[None]:
    """Every round trip of every PgConnection of this process, counted and timed: a statement
    (with the BEGIN that rides in front of it, counted under `begin folded`), a COMMIT or
    ROLLBACK of a transaction that sent anything, an executemany's pipeline."""
    from heron.store.pg import PgConnection

    original = (PgConnection._send, PgConnection._end, PgConnection.executemany)

    def send(self: PgConnection, plan: Any, params: Any) -> Any:
        if self._begin is not None:
            tally.kinds["begin folded"] += 1
        started = time.perf_counter()
        try:
            return original[0](self, plan, params)
        finally:
            tally.add(kind_of(plan.text), time.perf_counter() - started)

    def end(self: PgConnection, text: str) -> None:
        sends = self._begin is None or (text == "COMMIT" and self.bump_on_commit)
        started = time.perf_counter()
        try:
            original[1](self, text)
        finally:
            if sends:
                tally.add("commit", time.perf_counter() - started)

    def executemany(self: PgConnection, sql: str, rows: Any) -> None:
        started = time.perf_counter()
        try:
            original[2](self, sql, rows)
        finally:
            tally.add("write", time.perf_counter() - started)

    PgConnection._send = send  # type: ignore[method-assign]
    PgConnection._end = end  # type: ignore[method-assign]
    PgConnection.executemany = executemany  # type: ignore[method-assign]
    try:
        yield
    finally:
        (PgConnection._send, PgConnection._end, PgConnection.executemany) = original


def _reply_fn(tool: bool) -> Callable[[Any], Any]:
    from heron.messages import Reply, Text, ToolCall, Usage

    def answer(request: Any) -> Reply:
        last = request.messages[-1]
        if tool and not last.tool_results:
            call = ToolCall(f"c{uuid.uuid4().hex[:8]}", "read_file", {"path": "notes.txt"})
            return Reply([call], "tool", Usage(60, 8))
        return Reply([Text("Noted.")], "done", Usage(60, 3))

    return answer


async def run_once(conversations: int, turns: int, tool: bool) -> dict[str, Any]:
    from heron.agent.engine import Engine
    from heron.config import Settings
    from heron.providers.scripted import ScriptedProvider

    settings = Settings.load()
    settings.paths.ensure()
    (settings.paths.workspace / "notes.txt").write_text("Heron keeps every turn.\n")
    tally = Tally()
    provider = ScriptedProvider(_reply_fn(tool))
    async with Engine.open(settings, provider=provider) as engine:
        store = engine.store
        await engine.turn("warm-up", "hello")  # imports, prompt memo, first statements
        sqlite_trace = store.backend == "sqlite"
        if sqlite_trace:
            # Heron's statements only: SQLite reports those its triggers and FTS5 run as `--`.
            store.conn.set_trace_callback(
                lambda sql: None if sql.lstrip().startswith("--") else tally.add(kind_of(sql))
            )
        watch = counting_postgres(tally) if not sqlite_trace else _nothing()
        with watch:
            cpu, started = time.process_time(), time.perf_counter()
            for t in range(turns):
                for c in range(conversations):
                    result = await engine.turn(f"c{c}", f"message {t} of conversation {c}")
                    assert result.ok, result.run.error
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        if sqlite_trace:
            store.conn.set_trace_callback(None)
    n = conversations * turns
    return {
        "wall_ms": round(wall / n * 1000, 2),
        "cpu_ms": round(cpu / n * 1000, 2),
        "statements": round(sum(v for k, v in tally.kinds.items() if k in KINDS) / n, 1),
        "in_statements_ms": round(tally.seconds / n * 1000, 2) if not sqlite_trace else None,
        "by_kind": {k: round(tally.kinds[k] / n, 2) for k in KINDS},
        "begin_folded": round(tally.kinds["begin folded"] / n, 2),
        "load": float(Path("/proc/loadavg").read_text().split()[0]),
    }


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _server_url() -> tuple[str, Any]:
    """HERON_DATABASE_URL, else a throwaway server (stopped at the end)."""
    url = os.environ.get("HERON_DATABASE_URL")
    if url:
        return url, None
    import pg

    server = pg.start()
    return server.url, server


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    middle = sorted(runs, key=lambda r: r["wall_ms"])[(len(runs) - 1) // 2]
    return {
        **middle,
        "wall_ms_runs": [r["wall_ms"] for r in runs],
        "loads": [r["load"] for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tool", action="store_true", help="each turn makes one tool call")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    url, server = _server_url()
    results: dict[str, list[dict[str, Any]]] = {"sqlite": [], "postgresql": []}
    try:
        for _ in range(args.runs):
            for backend in results:  # alternating, in the same period
                os.environ["HERON_HOME"] = tempfile.mkdtemp(prefix="heron-pgturn-")
                if backend == "postgresql":
                    os.environ["HERON_DATABASE_URL"] = url  # the run's home: a fresh tenant
                else:
                    os.environ.pop("HERON_DATABASE_URL", None)
                figures = asyncio.run(run_once(args.conversations, args.turns, args.tool))
                results[backend].append(figures)
    finally:
        if server is not None:
            server.stop()
    summary = {backend: median(runs) for backend, runs in results.items()}
    if args.json:
        print(json.dumps(summary))
        return
    what = "one tool call" if args.tool else "no tool call"
    print(f"{args.conversations} conversations x {args.turns} turns, one at a time, {what}")
    header = f"{'':>11} {'wall ms':>8} {'cpu ms':>7} {'stmts':>6} {'in them ms':>11}  " + " ".join(
        f"{k:>8}" for k in KINDS
    )
    print(header)
    for backend, r in summary.items():
        inside = "-" if r["in_statements_ms"] is None else r["in_statements_ms"]
        kinds = " ".join(f"{r['by_kind'][k]:>8}" for k in KINDS)
        row = f"{backend:>11} {r['wall_ms']:>8} {r['cpu_ms']:>7} {r['statements']:>6}"
        print(f"{row} {inside:>11}  {kinds}")
        print(f"{'':>11} runs (wall ms): {r['wall_ms_runs']}, load: {r['loads']}")
    print(f"medians of {args.runs} alternating runs; statements are round trips on PostgreSQL")


if __name__ == "__main__":
    main()
