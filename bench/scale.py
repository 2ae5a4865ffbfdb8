"""Turns per second on PostgreSQL with DBOS workers against SQLite in one process (issue 18).

An instant model (a fake OpenAI server on 127.0.0.1 answering at once, in a process of its own
so that its CPU is nobody's) makes the load CPU-bound. C conversations each send T messages,
each the next once the previous one's turn has ended (as people would), through:

    sqlite_1    one process's AgentLoop on heron.db (the embedded default)
    pg_inproc   the same AgentLoop on PostgreSQL, no DBOS (where the store's round trips cost)
    pg_1, pg_2  a face (FrontLoop, enqueueing DBOS workflows, hearing the notes) and 1 or 2
                `heron worker` processes, on a throwaway PostgreSQL (tests/pg.py starts it)

The configurations alternate (`--runs` rounds of all of them, in the same period) and each
figure is the median, printed with every run's load average. CPU a turn is each process's
own (utime + stime from /proc): the workers', the face's (this process) and the PostgreSQL
server's (its backends, exited ones included), apart. `--idle S` measures 2 idle
workers for S seconds polling every 50 ms and slowed by the face's governor (CPU a second, and
the wait of the first message after an idle pause). `--slow N` adds the run of N
conversations with a 2 s model on 2 workers (and on sqlite_1, for reference) against the ideal
time: turns per conversation x 2 s, every conversation waiting only on its model.

    python bench/scale.py [--conversations 40 --turns 5 --runs 3] [--slow 1000] [--idle 10]
                          [--configs sqlite_1,pg_1,...] [--answer-chars 1200 --events] [--json]

`--answer-chars N --events` makes the turns a browser's: N characters of answer streamed 8 to
a delta, each delta a TurnEvent (on workers, a note to the face).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

TICKS = os.sysconf("SC_CLK_TCK")
WARM = 40  # conversations of the warm-up (2 turns each)
CONFIGS = ("sqlite_1", "pg_inproc", "pg_1", "pg_2")


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from its state on (field 3 is index 0), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_of(pids: list[int]) -> float:
    """Seconds of CPU the processes used so far (user + system)."""
    total = 0.0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def postgres_cpu(server: Any) -> float:
    """Seconds of CPU the bench's PostgreSQL server used so far: its postmaster, its live
    backends, and (the postmaster's children's times) every backend that has exited. Other
    servers on the machine (other people's tests) are not counted."""
    postmaster = int((server.folder / "data" / "postmaster.pid").read_text().split()[0])
    main = _stat(postmaster)
    if main is None:
        return 0.0
    total = sum(int(f) for f in main[11:15]) / TICKS  # utime stime cutime cstime
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (fields := _stat(int(d.name))) and fields[1] == str(postmaster):
            total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


# ---- the model, in a process of its own ---------------------------------------------------------


def serve_model(delay: float, chars: int = 0) -> None:
    """`--serve-model DELAY [CHARS]`: answer every request after DELAY s until stdin closes:
    "ok", or CHARS characters of text streamed 8 to a delta."""
    from heron.testing.fake_openai import FakeOpenAIServer
    from heron.testing.script import ServerReply

    def script(body: dict[str, Any]) -> ServerReply:
        text = ("lorem ipsum " * (chars // 12 + 1))[:chars] if chars else "ok"
        return ServerReply(text=text, delay_s=delay, output_tokens=max(1, chars // 4))

    server = FakeOpenAIServer(script)
    print(server.start(), flush=True)
    sys.stdin.read()
    server.stop()


@contextlib.contextmanager
def model(delay: float, chars: int = 0) -> Any:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-model", str(delay), str(chars)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


# ---- the load -----------------------------------------------------------------------------------


# Whether the bench's messages ask for their turns' events (deltas, tool starts...), as a
# browser's or a terminal's do; `--events` sets it.
EVENTS = {"on": False}


async def drive(loop: Any, conversations: int, turns: int, prefix: str = "c") -> float:
    """Each conversation's messages, the next once its previous turn ended; the seconds from
    the first message to the last turn's end."""
    from heron.bus import InboundMessage

    sent = dict.fromkeys(range(conversations), 0)
    done = asyncio.Event()

    def send(c: int) -> None:
        text = f"hello {sent[c]}"
        sent[c] += 1
        key = f"{prefix}{c}"
        message = InboundMessage("bench", key, text, key=key, events=EVENTS["on"])
        loop.bus.inbound.put_nowait(message)

    def ended(e: Any) -> None:
        if not e.key.startswith(prefix):
            return
        c = int(e.key[len(prefix) :])
        if sent[c] < turns:
            send(c)
        elif all(n == turns for n in sent.values()) and not loop.busy:
            done.set()

    unwatch = loop.watch_turns(ended)
    t0 = time.perf_counter()
    for c in range(conversations):
        send(c)
    await done.wait()
    await loop.wait_idle()
    unwatch()
    return time.perf_counter() - t0


async def warm_up(loop: Any, conversations: int, ready: Callable[[], bool] = lambda: True) -> None:
    """Turns before the measured ones (not counted): a process's first turn imports its model
    client and fills its caches. Again, up to 5 times, until `ready()` (every worker took one)."""
    for i in range(5):
        await drive(loop, conversations, 2, prefix=f"w{i}_")
        if ready():
            return


@contextlib.asynccontextmanager
async def running(loop: Any, *services: Callable[[Any], Awaitable[None]]) -> AsyncIterator[None]:
    from heron.bus import Dispatcher

    dispatcher = Dispatcher(loop.bus)

    async def drop(_: Any) -> None:
        return None

    dispatcher.register("*", drop)
    tasks = [asyncio.create_task(loop.run(idle=False)), asyncio.create_task(dispatcher.run())]
    tasks += [asyncio.create_task(service(loop)) for service in services]
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _env(home: Path, url: str, database: str | None) -> None:
    os.environ.pop("HERON_DATABASE_URL", None)
    os.environ.update(HERON_HOME=str(home), HERON_BASE_URL=url, HERON_MODEL="fake-model",
                      HERON_API_KEY="k", HERON_EMBEDDINGS="0")  # fmt: skip
    if database:
        os.environ["HERON_DATABASE_URL"] = database


def _schema(server: Any) -> str:
    import psycopg

    schema = f"b_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{server.url}?options=-csearch_path%3D{schema}"


def _figures(n: int, elapsed: float, latency: float, turns: int, **cpu: float) -> dict[str, float]:
    out = {"turns_per_s": round(n / elapsed, 1), "seconds": round(elapsed, 2)}
    out.update({k: round(1000 * v / n, 2) for k, v in cpu.items()})
    if latency:
        out["ideal_s"] = round(turns * latency, 2)
        out["x_ideal"] = round(elapsed / (turns * latency), 3)
    return out


async def run_inprocess(
    home: Path, url: str, database: str | None, conversations: int, turns: int,
    latency: float = 0.0, server: Any = None,
) -> dict[str, float]:  # fmt: skip
    """One process's AgentLoop: on heron.db, or on `database` (PostgreSQL, no DBOS)."""
    from heron.agent.engine import Engine
    from heron.agent.loop import AgentLoop
    from heron.bus import MessageBus
    from heron.config import Settings

    _env(home, url, database)
    try:
        async with Engine.open(Settings.load()) as engine:
            loop = AgentLoop(engine, MessageBus())
            async with running(loop):
                await warm_up(loop, min(conversations, WARM))
                p0 = postgres_cpu(server) if server else 0.0
                cpu0 = time.process_time()
                elapsed = await drive(loop, conversations, turns)
                cpu = time.process_time() - cpu0
                pg = postgres_cpu(server) - p0 if server else 0.0
    finally:
        os.environ.pop("HERON_DATABASE_URL", None)
    extra = {"postgres_cpu_ms_per_turn": pg} if server else {}
    return _figures(conversations * turns, elapsed, latency, turns, cpu_ms_per_turn=cpu, **extra)


async def run_workers(
    home: Path, url: str, server: Any, workers: int, conversations: int, turns: int,
    latency: float = 0.0,
) -> dict[str, float]:  # fmt: skip
    """A face in this process and `workers` `heron worker` processes, on a fresh schema."""
    from dbos import DBOSClient
    from scale_helpers import Workers, worker_env

    from heron.agent.engine import Engine
    from heron.bus import MessageBus
    from heron.config import Settings
    from heron.providers.scripted import ScriptedProvider
    from heron.scale.cluster import cluster_of
    from heron.scale.front import FrontLoop, listener_service
    from heron.scale.notes import Publisher

    pg_url = _schema(server)
    pool = Workers(worker_env(home, pg_url, url))
    _env(home, url, pg_url)
    try:
        pool.start(workers)
        cluster = cluster_of(pg_url)
        client = DBOSClient(system_database_url=cluster.dbos_url,
                            dbos_system_schema=cluster.dbos_schema)  # fmt: skip
        publisher = Publisher(cluster)
        async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
            loop = FrontLoop(engine, MessageBus(), queue=client, publisher=publisher)
            async with running(loop, listener_service(cluster)):
                await loop.listening.wait()
                await warm_up(loop, min(conversations, WARM), lambda: _executors(pg_url) == workers)
                pids = [p.pid for p in pool.procs]
                w0, p0, f0 = cpu_of(pids), postgres_cpu(server), time.process_time()
                elapsed = await drive(loop, conversations, turns)
                w, p, f = cpu_of(pids) - w0, postgres_cpu(server) - p0, time.process_time() - f0
        await publisher.close()
        client.destroy()
    finally:
        pool.stop()
        os.environ.pop("HERON_DATABASE_URL", None)
    return _figures(conversations * turns, elapsed, latency, turns, cpu_ms_per_turn=w,
                    face_cpu_ms_per_turn=f, postgres_cpu_ms_per_turn=p)  # fmt: skip


async def run_idle(home: Path, url: str, server: Any, seconds: float) -> dict[str, Any]:
    """2 idle workers: their CPU and PostgreSQL's a second, and the wait of a message sent
    after an idle pause (to its turn's end, the model instant), with the queue polled every
    50 ms and with the face's governor having slowed it (heron/scale/polling.py)."""
    from dbos import DBOSClient
    from scale_helpers import Workers, worker_env

    from heron.agent.engine import Engine
    from heron.bus import MessageBus
    from heron.config import Settings
    from heron.providers.scripted import ScriptedProvider
    from heron.scale.cluster import QUEUE, cluster_of
    from heron.scale.front import FrontLoop, listener_service
    from heron.scale.notes import Publisher
    from heron.scale.polling import PollGovernor

    pg_url = _schema(server)
    pool = Workers(worker_env(home, pg_url, url))
    _env(home, url, pg_url)
    out: dict[str, Any] = {}
    try:
        pool.start(2)
        cluster = cluster_of(pg_url)
        client = DBOSClient(system_database_url=cluster.dbos_url,
                            dbos_system_schema=cluster.dbos_schema)  # fmt: skip
        queue = await client.retrieve_queue_async(QUEUE)
        governor = PollGovernor(queue, idle_after_s=0.0, check_s=0.1)
        publisher = Publisher(cluster)
        async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
            loop = FrontLoop(engine, MessageBus(), queue=client, publisher=publisher)
            async with running(loop, listener_service(cluster)):
                await loop.listening.wait()
                await warm_up(loop, 4, lambda: _executors(pg_url) == 2)
                pids = [p.pid for p in pool.procs]
                for mode in ("fast", "slow"):
                    interval = governor.fast_s if mode == "fast" else governor.slow_s
                    await queue.set_polling_interval_sec_async(interval)
                    await asyncio.sleep(2.0)  # every worker has read it (and eased down)
                    w0, p0 = cpu_of(pids), postgres_cpu(server)
                    await asyncio.sleep(seconds)
                    w, p = cpu_of(pids) - w0, postgres_cpu(server) - p0
                    waits = []
                    for i in range(5):
                        await queue.set_polling_interval_sec_async(interval)
                        await asyncio.sleep(2.0)  # idle: the workers poll at `interval`
                        t0 = time.perf_counter()
                        if mode == "slow":  # what the face does before it enqueues
                            governor.slow = True  # (it had slowed the workers: set above)
                            await governor.busy()
                        await drive(loop, 1, 1, prefix=f"{mode}{i}_")
                        waits.append(time.perf_counter() - t0)
                    out[mode] = {
                        "interval_s": interval,
                        "workers_cpu_ms_per_s": round(1000 * w / seconds, 1),
                        "postgres_cpu_ms_per_s": round(1000 * p / seconds, 1),
                        "first_message_ms": round(1000 * statistics.median(waits), 1),
                        "first_message_ms_runs": [round(1000 * x, 1) for x in waits],
                    }
        await publisher.close()
        client.destroy()
    finally:
        pool.stop()
        os.environ.pop("HERON_DATABASE_URL", None)
    return out


def _executors(pg_url: str) -> int:
    """How many workers have taken a turn so far."""
    import psycopg

    from heron.scale.cluster import cluster_of

    table = cluster_of(pg_url).dbos_schema + ".workflow_status"
    with psycopg.connect(pg_url.split("?")[0]) as conn:
        row = conn.execute(f"SELECT COUNT(DISTINCT executor_id) FROM {table}").fetchone()
    return int(row[0]) if row else 0


# ---- the report ---------------------------------------------------------------------------------


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _median(runs: list[dict[str, float]]) -> dict[str, Any]:
    keys = [k for k in runs[0] if k != "load"]
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 2) for k in keys}
    out["runs"] = runs
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import pg as pgtest

    server = pgtest.start()
    c, t = args.conversations, args.turns
    names = [n for n in CONFIGS if n in args.configs.split(",")]  # "" for none
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    configs: dict[str, Callable[[Path, str], Awaitable[dict[str, float]]]] = {
        "sqlite_1": lambda h, url: run_inprocess(h, url, None, c, t),
        "pg_inproc": lambda h, url: run_inprocess(h, url, _schema(server), c, t, server=server),
        "pg_1": lambda h, url: run_workers(h, url, server, 1, c, t),
        "pg_2": lambda h, url: run_workers(h, url, server, 2, c, t),
    }
    result: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp, model(0.0, args.answer_chars) as url:
            for i in range(args.runs):  # alternating: every configuration once per round
                for name in names:
                    home = Path(tmp) / f"{name}-{i}"
                    home.mkdir()
                    load = _load()
                    runs[name].append({**await configs[name](home, url), "load": load})
                    print(name, runs[name][-1], flush=True)
        for name in names:
            result[name] = _median(runs[name])
        if names:
            result["cpu_ms_per_turn"] = {k: result[k]["cpu_ms_per_turn"] for k in names}
        if args.idle:
            with tempfile.TemporaryDirectory() as tmp, model(0.0) as url:
                home = Path(tmp) / "idle"
                home.mkdir()
                result["idle"] = {**await run_idle(home, url, server, args.idle), "load": _load()}
                print("idle", result["idle"], flush=True)
        if args.slow:
            with tempfile.TemporaryDirectory() as tmp, model(2.0) as url:
                n, turns = args.slow, args.slow_turns
                for name, run in (
                    ("pg_2", lambda h: run_workers(h, url, server, 2, n, turns, 2.0)),
                    ("sqlite_1", lambda h: run_inprocess(h, url, None, n, turns, 2.0)),
                ):
                    home = Path(tmp) / name
                    home.mkdir()
                    load = _load()
                    key = f"slow_{n}" if name == "pg_2" else f"slow_{n}_{name}"
                    result[key] = {**await run(home), "load": load}
                    print(key, result[key], flush=True)
    finally:
        server.stop()
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-model"]:
        serve_model(float(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3, help="rounds of every configuration")
    parser.add_argument("--slow", type=int, default=0, help="conversations of the 2 s run")
    parser.add_argument("--slow-turns", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which to run (all)")
    parser.add_argument("--idle", type=float, default=0, help="seconds of 2 idle workers' CPU")
    parser.add_argument("--answer-chars", type=int, default=0, help="answers' length (ok)")
    parser.add_argument("--events", action="store_true", help="messages ask for turn events")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    EVENTS["on"] = args.events
    figures = asyncio.run(main(args))
    tps = {k: figures[k]["turns_per_s"] for k in CONFIGS if k in figures}
    if {"pg_1", "pg_2"} <= tps.keys():
        print(f"pg_2 / pg_1 = {tps['pg_2'] / tps['pg_1']:.2f} (target 1.6)")
    if {"pg_1", "sqlite_1"} <= tps.keys():
        print(f"pg_1 / sqlite_1 = {tps['pg_1'] / tps['sqlite_1']:.2f} (target 0.7)")
    if args.json:
        print(json.dumps(figures))
