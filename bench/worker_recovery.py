"""How long a turn waits when its worker is killed: `heron serve --workers N` on a throwaway
PostgreSQL (tests/pg.py starts it), a fake OpenAI server on 127.0.0.1 as the model.

Each run sends `heron run -c KEY "work on KEY"`; the turn calls a tool, then its second model
call is held; the worker running it is killed with SIGKILL; the figure is the time from the
kill to the `heron run`'s exit with the answer. With `--workers 1` the face must start another
worker (a backoff of 1 s, the worker's start, its first look for dead workers' turns); with 2,
the other worker takes the turn over (its look comes every second, heron/scale/worker.py
SWEEP_S). The configurations alternate, each run on a fresh serve and home; medians printed
with every run's load average, and one JSON line with `--json`.

    python bench/worker_recovery.py [--runs 3] [--configs 1,2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _holding(held: dict[str, float]) -> Any:
    from heron.testing.script import ServerReply

    def script(body: dict[str, Any]) -> ServerReply:
        roles = [m["role"] for m in body["messages"]]
        if "tool" not in roles[len(roles) - 1 - roles[::-1].index("user") :]:
            return ServerReply(tool_calls=[("bash", {"command": "echo ran"})])
        return ServerReply(text="finished", delay_s=held.pop("turn", 0.0))

    return script


def _owner_pid(pg_url: str, dbos_schema: str) -> int | None:
    import psycopg

    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
        row = conn.execute(
            f"SELECT executor_id FROM {dbos_schema}.workflow_status WHERE status = 'PENDING'"
        ).fetchone()
    return None if row is None else int(str(row[0]).split("-")[-2])


async def one_run(server: Any, workers: int) -> float:
    """Seconds from the kill of the worker running a turn to its `heron run`'s answer."""
    import pg as pgtest
    from scale_helpers import model_server, worker_env

    from heron.scale.cluster import cluster_of

    pg_url = pgtest.schema_url(server)
    held = {"turn": 300.0}
    with model_server(_holding(held)) as (model, url), tempfile.TemporaryDirectory() as tmp:
        env = worker_env(Path(tmp), pg_url, url)
        face = subprocess.Popen(
            [sys.executable, "-m", "heron", "serve", "--port", "0", "--workers", str(workers)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            assert face.stdout is not None and face.stdout.readline().startswith("heron serve")
            run = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "heron", "run", "-c", "k", "work on k", env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            async with asyncio.timeout(300):
                while len(model.requests) < 2:  # the tool ran; the answer is held
                    await asyncio.sleep(0.01)
            pid = _owner_pid(pg_url, cluster_of(pg_url).dbos_schema)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            out, _ = await asyncio.wait_for(run.communicate(), 300)
            took = time.monotonic() - killed
            assert run.returncode == 0 and b"finished" in out, out
            return took
        finally:
            face.send_signal(signal.SIGTERM)
            try:
                face.wait(120)
            except subprocess.TimeoutExpired:
                face.kill()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--configs", default="1,2", help="worker counts, alternated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import pg as pgtest

    server = pgtest.start()
    figures: dict[str, list[tuple[float, float]]] = {}
    try:
        for _ in range(args.runs):
            for n in (int(c) for c in args.configs.split(",")):
                took = await one_run(server, n)
                figures.setdefault(f"workers_{n}", []).append((took, _load()))
                print(f"--workers {n}: {took:.2f} s from the kill to the answer (load {_load()})")
    finally:
        server.stop()
    result = {}
    for name, runs in figures.items():
        median = statistics.median(t for t, _ in runs)
        loads = ", ".join(f"{load:.1f}" for _, load in runs)
        print(f"{name}: median {median:.2f} s over {len(runs)} runs (load {loads})")
        result[name] = {"median_s": round(median, 3), "runs_s": [round(t, 3) for t, _ in runs]}
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
