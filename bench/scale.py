"""Turns per second on PostgreSQL with DBOS workers against SQLite in one process (issue 18).

An instant model (a fake OpenAI server on 127.0.0.1 answering at once) makes the load
CPU-bound: `sqlite_1` runs C conversations x T turns in one process's AgentLoop on heron.db;
`pg_1` and `pg_2` run the same through a face (FrontLoop, enqueueing DBOS workflows) and 1 or 2
`heron worker` processes on a throwaway PostgreSQL (tests/pg.py starts it). CPU a turn is the
workers' own (utime + stime from /proc), the face's and the PostgreSQL server's apart.
`--slow` adds the run of many conversations with a 2 s model on 2 workers against the ideal
time (turns per conversation x 2 s: every conversation waiting only on its model).

    python bench/scale.py [--conversations 40 --turns 5] [--slow 1000] [--json]
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_of(pids: list[int]) -> float:
    """Seconds of CPU the processes used so far (user + system)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def postgres_pids() -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "postgres":
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def echo(delay: float) -> Any:
    from heron.testing.script import ServerReply

    def script(body: dict[str, Any]) -> ServerReply:
        return ServerReply(text="ok", delay_s=delay, output_tokens=1)

    return script


async def run_sqlite(home: Path, url: str, conversations: int, turns: int) -> dict[str, float]:
    from heron.agent.engine import Engine
    from heron.agent.loop import AgentLoop
    from heron.bus import Dispatcher, InboundMessage, MessageBus
    from heron.config import Settings

    os.environ.pop("HERON_DATABASE_URL", None)
    os.environ.update(HERON_HOME=str(home), HERON_BASE_URL=url, HERON_MODEL="fake-model",
                      HERON_API_KEY="k", HERON_EMBEDDINGS="0")  # fmt: skip
    async with Engine.open(Settings.load()) as engine:
        bus = MessageBus()
        loop = AgentLoop(engine, bus)
        dispatcher = Dispatcher(bus)

        async def drop(_: Any) -> None:
            return None

        dispatcher.register("*", drop)
        tasks = [asyncio.create_task(loop.run(idle=False)), asyncio.create_task(dispatcher.run())]
        cpu0, t0 = time.process_time(), time.perf_counter()
        for turn in range(turns):
            for c in range(conversations):
                bus.inbound.put_nowait(
                    InboundMessage("bench", f"c{c}", f"hello {turn}", key=f"c{c}")
                )
            await bus.inbound.join()
            await loop.wait_idle()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        for t in tasks:
            t.cancel()
    n = conversations * turns
    return {"turns_per_s": round(n / elapsed, 1), "cpu_ms_per_turn": round(1000 * cpu / n, 2),
            "seconds": round(elapsed, 2)}  # fmt: skip


async def run_pg(
    home: Path, url: str, pg_base: str, workers: int, conversations: int, turns: int,
    latency: float = 0.0,
) -> dict[str, float]:  # fmt: skip
    import psycopg
    from dbos import DBOSClient
    from scale_helpers import Workers, worker_env

    from heron.agent.engine import Engine
    from heron.bus import Dispatcher, InboundMessage, MessageBus
    from heron.config import Settings
    from heron.providers.scripted import ScriptedProvider
    from heron.scale.cluster import cluster_of
    from heron.scale.front import FrontLoop, listener_service
    from heron.scale.notes import Publisher

    schema = f"b_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    pg_url = f"{pg_base}?options=-csearch_path%3D{schema}"
    pool = Workers(worker_env(home, pg_url, url))
    pool.start(workers)
    os.environ["HERON_DATABASE_URL"] = pg_url
    try:
        cluster = cluster_of(pg_url)
        client = DBOSClient(system_database_url=cluster.dbos_url,
                            dbos_system_schema=cluster.dbos_schema)  # fmt: skip
        publisher = Publisher(cluster)
        async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
            bus = MessageBus()
            loop = FrontLoop(engine, bus, queue=client, publisher=publisher)
            dispatcher = Dispatcher(bus)

            async def drop(_: Any) -> None:
                return None

            dispatcher.register("*", drop)
            tasks = [asyncio.create_task(loop.run(idle=False)),
                     asyncio.create_task(dispatcher.run()),
                     asyncio.create_task(listener_service(cluster)(loop))]  # fmt: skip
            pids = [p.pid for p in pool.procs]
            pg_pids = postgres_pids()
            w0, p0, f0 = cpu_of(pids), cpu_of(pg_pids), time.process_time()
            t0 = time.perf_counter()
            for turn in range(turns):  # as people would: the next message after the answer
                for c in range(conversations):
                    bus.inbound.put_nowait(
                        InboundMessage("bench", f"c{c}", f"hello {turn}", key=f"c{c}")
                    )
                await bus.inbound.join()
                await loop.wait_idle()
            elapsed = time.perf_counter() - t0
            w, p, f = cpu_of(pids) - w0, cpu_of(pg_pids) - p0, time.process_time() - f0
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await publisher.close()
        client.destroy()
    finally:
        pool.stop()
        os.environ.pop("HERON_DATABASE_URL", None)
    n = conversations * turns
    out = {
        "turns_per_s": round(n / elapsed, 1),
        "seconds": round(elapsed, 2),
        "cpu_ms_per_turn": round(1000 * w / n, 2),
        "face_cpu_ms_per_turn": round(1000 * f / n, 2),
        "postgres_cpu_ms_per_turn": round(1000 * p / n, 2),
    }
    if latency:
        out["ideal_s"] = round(turns * latency, 2)
        out["x_ideal"] = round(elapsed / (turns * latency), 3)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import pg as pgtest

    from heron.testing.fake_openai import FakeOpenAIServer

    server = pgtest.start()
    fake = FakeOpenAIServer(echo(0.0))
    url = fake.start()
    result: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, run in (
                ("sqlite_1", lambda h: run_sqlite(h, url, args.conversations, args.turns)),
                ("pg_1", lambda h: run_pg(h, url, server.url, 1, args.conversations, args.turns)),
                ("pg_2", lambda h: run_pg(h, url, server.url, 2, args.conversations, args.turns)),
            ):
                home = Path(tmp) / name
                home.mkdir()
                load = os.getloadavg()[0]
                result[name] = {**await run(home), "load": round(load, 2)}
                print(name, result[name], flush=True)
            result["cpu_ms_per_turn"] = {
                k: result[k]["cpu_ms_per_turn"] for k in ("sqlite_1", "pg_1", "pg_2")
            }
            if args.slow:
                fake.stop()
                fake = FakeOpenAIServer(echo(2.0))
                url2 = fake.start()
                home = Path(tmp) / "slow"
                home.mkdir()
                load = os.getloadavg()[0]
                slow = await run_pg(home, url2, server.url, 2, args.slow, args.slow_turns, 2.0)
                result[f"slow_{args.slow}"] = {**slow, "load": round(load, 2)}
                print("slow", result[f"slow_{args.slow}"], flush=True)
    finally:
        fake.stop()
        server.stop()
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--slow", type=int, default=0, help="conversations of the 2 s run")
    parser.add_argument("--slow-turns", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(main(args))
    s1, p1, p2 = (figures[k]["turns_per_s"] for k in ("sqlite_1", "pg_1", "pg_2"))
    print(f"pg_2 / pg_1 = {p2 / p1:.2f} (target 1.6); pg_1 / sqlite_1 = {p1 / s1:.2f} (target 0.7)")
    if args.json:
        print(json.dumps(figures))
