"""The scheduler under load and at rest.

Load: `--jobs` one-off reminders (default 1,000) spread over `--conversations` conversations
(default 100), all due at the same instant a few seconds ahead, fired by the real scheduler on
the system clock through the AgentLoop to an instant scripted model. A job's lag is the time
from its instant to the end of the turn it opened (its outcome recorded); the figures are the
largest and the 95th percentile, and how late the last fire was published on the bus (the
scheduler's own share; the rest is the turns themselves). Target: every job done within 60 s
of its instant.

Rest: the same scheduler with `--jobs` jobs due far in the future (and the heartbeat on, with
nothing in HEARTBEAT.md) for `--idle-seconds`; the process's CPU time over that wall time, as
a percentage of one core. Target: under 1%.

    .venv/bin/python bench/scheduler.py [--jobs 1000] [--conversations 100]
        [--idle-seconds 30] [--json]

`--json` prints one line: {"jobs", "fired", "max_lag_s", "p95_lag_s", "idle_cpu_percent"}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

LEAD_S = 3.0  # the instant is this far ahead of the start, so every job is saved before it


async def load(jobs: int, conversations: int) -> dict[str, Any]:
    from heron.agent.engine import Engine
    from heron.agent.loop import AgentLoop, TurnEnded
    from heron.bus import Dispatcher, MessageBus
    from heron.config import Settings
    from heron.messages import Reply, Text, Usage
    from heron.proactive.clock import SystemClock
    from heron.proactive.scheduler import Scheduler
    from heron.providers.scripted import ScriptedProvider
    from heron.store import jobs as js
    from heron.store.schedule import parse
    from heron.tools.registry import ToolRegistry

    provider = ScriptedProvider(lambda _: Reply([Text("ok")], "done", Usage(50, 2)))
    ended: dict[int, float] = {}
    finished = asyncio.Event()
    async with Engine.open(Settings.load(), provider=provider, registry=ToolRegistry([])) as engine:
        bus = MessageBus()
        loop = AgentLoop(engine, bus)
        dispatcher = Dispatcher(bus)
        published: list[float] = []

        class Timed(Scheduler):
            async def _publish(self, fire: js.Fire) -> None:
                published.append(time.time())
                await super()._publish(fire)

        scheduler = Timed(engine.store, bus, SystemClock())
        scheduler.watch(loop)

        def on_end(turn: TurnEnded) -> None:
            if "job" in turn.message.meta:
                ended[int(turn.message.meta["job"])] = time.time()
                if len(ended) == jobs:
                    finished.set()

        loop.watch_turns(on_end)
        instant = time.time() + LEAD_S
        when = parse(at=dt.datetime.fromtimestamp(instant, dt.UTC).isoformat(), timezone="UTC")
        instant = dt.datetime.fromisoformat(when.spec).timestamp()
        for i in range(jobs):
            js.create_job(
                engine.store, when, conversation=f"bench-{i % conversations}",
                prompt=f"reminder {i}", now=time.time(),
            )  # fmt: skip
        tasks = [
            asyncio.create_task(loop.run(idle=False)),
            asyncio.create_task(dispatcher.run()),
            asyncio.create_task(scheduler.run()),
        ]
        try:
            await asyncio.wait_for(finished.wait(), LEAD_S + 600)
        finally:
            await loop.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        done = sum(1 for r in js.runs(engine.store, limit=jobs * 2) if r.status == "done")
    lags = sorted(at - instant for at in ended.values())
    return {
        "jobs": jobs,
        "fired": scheduler.fired,
        "done": done,
        "max_lag_s": round(lags[-1], 3),
        "p95_lag_s": round(lags[int(0.95 * (len(lags) - 1))], 3),
        "median_lag_s": round(statistics.median(lags), 3),
        "publish_max_lag_s": round(max(published) - instant, 3),
    }


async def idle(jobs: int, seconds: float) -> float:
    from heron.agent.engine import Engine
    from heron.agent.loop import AgentLoop
    from heron.bus import MessageBus
    from heron.config import Settings
    from heron.proactive.background import run_proactive
    from heron.providers.scripted import ScriptedProvider
    from heron.store import jobs as js
    from heron.store.schedule import parse
    from heron.tools.registry import ToolRegistry

    async with Engine.open(
        Settings.load(), provider=ScriptedProvider([]), registry=ToolRegistry([])
    ) as engine:
        daily = parse(cron="0 3 * * *", timezone="UTC")
        for i in range(jobs):
            js.create_job(
                engine.store, daily, conversation=f"c{i % 100}", prompt="p", now=time.time()
            )
        loop = AgentLoop(engine, MessageBus())
        task = asyncio.create_task(run_proactive(loop, engine))
        await asyncio.sleep(1.0)  # started and asleep
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        used = time.process_time() - cpu
        elapsed = time.perf_counter() - wall
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return round(100 * used / elapsed, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    os.environ["HERON_HOME"] = tempfile.mkdtemp(prefix="heron-bench-sched-")
    figures = asyncio.run(load(args.jobs, args.conversations))
    os.environ["HERON_HOME"] = tempfile.mkdtemp(prefix="heron-bench-sched-idle-")
    figures["idle_cpu_percent"] = asyncio.run(idle(args.jobs, args.idle_seconds))
    if args.json:
        keys = ("jobs", "fired", "max_lag_s", "p95_lag_s", "idle_cpu_percent")
        print(json.dumps({k: figures[k] for k in keys}))
        return
    print(f"{figures['jobs']:,} jobs due at one instant over {args.conversations} conversations")
    print(f"  fired {figures['fired']:,}, done {figures['done']:,}")
    print(
        f"  lag from the instant to the turn's end: median {figures['median_lag_s']} s,"
        f" p95 {figures['p95_lag_s']} s, max {figures['max_lag_s']} s (target: max under 60 s)"
    )
    print(
        f"  every fire published on the bus within {figures['publish_max_lag_s']} s of the instant"
    )
    print(
        f"  idle: {figures['idle_cpu_percent']}% of one core over {args.idle_seconds:g} s"
        " (target: under 1%)"
    )
    ok = figures["max_lag_s"] < 60 and figures["done"] == figures["jobs"]
    sys.exit(0 if ok and figures["idle_cpu_percent"] < 1 else 1)


if __name__ == "__main__":
    main()
