"""How the turn engine scales with concurrent conversations.

For 1, 10, 50 and 100 conversations, each user sends `--turns` messages in a row (the next once the
previous answer arrives) through the bus and the AgentLoop, to a scripted model whose every
reply takes `--latency-ms`. It prints turns per second, the engine's overhead per turn (the time
from sending a message to receiving its answer, minus the model's latency) at p50 and p95, and
total time against the ideal (turns x latency / conversations: every conversation waiting only
on its model). Targets: within 2x of ideal at 50 conversations, 1.2x at 100.

It also prints the engine's CPU time per turn, and a floor: the same 100 conversations through
a bare asyncio loop that only commits each turn's user message (with its turn row) and its
reply in the real store, two transactions a turn, and does nothing else. The floor is what any
engine that persists its turns pays on this machine; `--floor-extra-us` adds that many
microseconds of CPU to each of its turns, to find the per-turn budget a ratio allows here.

    .venv/bin/python bench/concurrency.py [--latency-ms 100] [--turns 5] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import Any

# 50 conversations x 5 turns is the load tests/test_engine_loop.py checks for correctness; its
# time is measured here (a test never asserts a wall time: docs/testing.md).
LEVELS = (1, 10, 50, 100)


async def measure(conversations: int, turns: int, latency: float) -> dict[str, float]:
    from heron.agent.engine import Engine
    from heron.agent.loop import AgentLoop
    from heron.bus import Dispatcher, InboundMessage, MessageBus, OutboundMessage
    from heron.config import Settings
    from heron.messages import Reply, Text, Usage
    from heron.providers.scripted import ScriptedProvider

    async def answer(request: object) -> Reply:
        await asyncio.sleep(latency)
        return Reply([Text("ok")], "done", Usage(50, 2))

    bus = MessageBus()
    dispatcher = Dispatcher(bus)
    sent: dict[str, float] = {}
    counts: dict[str, int] = defaultdict(int)
    overheads: list[float] = []
    finished = asyncio.Event()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        loop = AgentLoop(engine, bus)

        async def send(chat: str) -> None:
            sent[chat] = time.perf_counter()
            await loop.dispatch(InboundMessage("bench", chat, f"{chat} message {counts[chat]}"))

        async def on_answer(out: OutboundMessage) -> None:
            overheads.append(time.perf_counter() - sent[out.chat_id] - latency)
            counts[out.chat_id] += 1
            if counts[out.chat_id] < turns:
                await send(out.chat_id)
            elif sum(counts.values()) == conversations * turns:
                finished.set()

        dispatcher.register("bench", on_answer)
        pump = asyncio.create_task(dispatcher.run())
        cpu, started = cpu_seconds(), time.perf_counter()
        for i in range(conversations):
            await send(f"c{i}")
        await finished.wait()
        elapsed = time.perf_counter() - started
        pump.cancel()
    # Read once the engine has closed: its auto-recall process has exited and been waited for,
    # so its CPU time is counted too.
    cpu = cpu_seconds() - cpu
    return _figures(conversations, turns, latency, elapsed, cpu, overheads)


def cpu_seconds() -> float:
    """CPU time of this process (the loop and every thread) and of its children that exited."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


def _figures(
    conversations: int,
    turns: int,
    latency: float,
    elapsed: float,
    cpu: float,
    overheads: list[float],
) -> dict[str, float]:
    ideal = turns * latency
    overheads.sort()
    return {
        "turns_per_s": round(conversations * turns / elapsed, 1),
        "p50_ms": round(statistics.median(overheads) * 1000, 2),
        "p95_ms": round(overheads[int(0.95 * (len(overheads) - 1))] * 1000, 2),
        "elapsed_s": round(elapsed, 3),
        "ideal_s": round(ideal, 3),
        "ratio": round(elapsed / ideal, 3),
        # CPU time per turn: the loop, every thread, and the auto-recall process
        "cpu_ms_per_turn": round(cpu / (conversations * turns) * 1000, 3),
    }


async def measure_floor(
    conversations: int, turns: int, latency: float, extra_us: float = 0.0
) -> dict[str, float]:
    """The same workload through a bare loop: a task per turn that commits the user's message
    with its turn row, waits `latency`, commits the reply and the finished turn, and answers
    through a queue. `extra_us` of busy CPU per turn stands for everything else a turn does."""
    from heron.messages import Message, Text, Usage
    from heron.store import Store

    home = tempfile.mkdtemp(prefix="heron-floor-")
    store = Store(os.path.join(home, "floor.db"))
    ids = {f"c{i}": store.open_conversation(f"floor:c{i}").id for i in range(conversations)}
    answers: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

    def spend(us: float) -> None:
        end = time.perf_counter() + us / 1e6
        while time.perf_counter() < end:
            pass

    async def turn(chat: str, n: int, sent: float) -> None:
        spend(extra_us / 2)
        run = f"{chat}-{n}"
        turn_id, _ = store.begin_turn(ids[chat], run, Message("user", [Text(f"{chat} {n}")]))
        await asyncio.sleep(latency)
        spend(extra_us / 2)
        with store.transaction():
            store.append(ids[chat], Message("assistant", [Text("ok")]), turn_id=turn_id)
            store.finish_turn(
                turn_id,
                status="done",
                stop_reason="done",
                usage=Usage(50, 2),
                model_calls=1,
                tool_calls=0,
            )
        await answers.put((chat, sent))

    tasks: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak refs)

    def start(chat: str, n: int) -> None:
        task = asyncio.create_task(turn(chat, n, time.perf_counter()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    cpu, started = time.process_time(), time.perf_counter()
    for chat in ids:
        start(chat, 0)
    counts: dict[str, int] = defaultdict(int)
    overheads: list[float] = []
    for _ in range(conversations * turns):
        chat, sent = await answers.get()
        overheads.append(time.perf_counter() - sent - latency)
        counts[chat] += 1
        if counts[chat] < turns:
            start(chat, counts[chat])
    elapsed = time.perf_counter() - started
    store.close()
    return _figures(conversations, turns, latency, elapsed, time.process_time() - cpu, overheads)


def median_run(
    runs: int, run: Callable[[], Coroutine[Any, Any, dict[str, float]]]
) -> dict[str, Any]:
    """The median of `runs` runs by x ideal (this machine's speed drifts by a third within
    minutes, so one run can mislead), each in a fresh home; with the range when runs > 1."""
    figures: list[dict[str, Any]] = []
    for _ in range(runs):
        os.environ["HERON_HOME"] = tempfile.mkdtemp(prefix="heron-bench-")
        figures.append(asyncio.run(run()))
    figures.sort(key=lambda f: f["ratio"])
    middle = figures[(len(figures) - 1) // 2]
    if runs > 1:
        middle = {
            **middle,
            "runs": runs,
            "ratio_range": [figures[0]["ratio"], figures[-1]["ratio"]],
        }
    return middle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation")
    parser.add_argument(
        "--floor-extra-us",
        type=float,
        default=0.0,
        help="CPU microseconds added to each turn of the floor loop (default 0)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="runs of each level; the median run (by x ideal) is reported, with the range",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    latency = args.latency_ms / 1000
    results = {}
    for n in LEVELS:
        results[str(n)] = median_run(args.runs, lambda n=n: measure(n, args.turns, latency))
    floor = median_run(
        args.runs,
        lambda: measure_floor(LEVELS[-1], args.turns, latency, args.floor_extra_us),
    )
    results["floor"] = {**floor, "conversations": LEVELS[-1], "extra_us": args.floor_extra_us}
    if args.json:
        print(json.dumps(results))
        return
    print(f"latency {args.latency_ms:.0f} ms, {args.turns} turns per conversation")
    print(
        f"{'convs':>6} {'turns/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'total s':>8} "
        f"{'ideal s':>8} {'x ideal':>8} {'cpu ms/turn':>12}"
    )
    for n, r in results.items():
        label = f"{LEVELS[-1]}*" if n == "floor" else n
        spread = " ({}-{})".format(*r["ratio_range"]) if "ratio_range" in r else ""
        print(
            f"{label:>6} {r['turns_per_s']:>9} {r['p50_ms']:>8} {r['p95_ms']:>8} "
            f"{r['elapsed_s']:>8} {r['ideal_s']:>8} {r['ratio']:>8} {r['cpu_ms_per_turn']:>12}"
            f"{spread}"
        )
    if args.runs > 1:
        print(f"each row: the median of {args.runs} runs by x ideal (the range in brackets)")
    print(
        f"* floor: a bare loop that only commits each turn's two messages"
        f" (+{args.floor_extra_us:.0f} us of CPU a turn)"
    )
    sys.stdout.flush()
    for n, bound in (("50", 2.0), ("100", 1.2)):
        ok = results[n]["ratio"] <= bound
        print(
            f"target ({n} conversations within {bound}x ideal): {'met' if ok else 'NOT met'}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
