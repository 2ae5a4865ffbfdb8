"""How the turn engine scales with concurrent conversations.

For 1, 10 and 100 conversations, each user sends `--turns` messages in a row (the next once the
previous answer arrives) through the bus and the AgentLoop, to a scripted model whose every
reply takes `--latency-ms`. It prints turns per second, the engine's overhead per turn (the time
from sending a message to receiving its answer, minus the model's latency) at p50 and p95, and
total time against the ideal (turns x latency / conversations: every conversation waiting only
on its model). Target: within 1.2x of ideal at 100 conversations.

    .venv/bin/python bench/concurrency.py [--latency-ms 100] [--turns 5] [--json]
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

LEVELS = (1, 10, 100)


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
        started = time.perf_counter()
        for i in range(conversations):
            await send(f"c{i}")
        await finished.wait()
        elapsed = time.perf_counter() - started
        pump.cancel()
    ideal = turns * latency
    overheads.sort()
    return {
        "turns_per_s": round(conversations * turns / elapsed, 1),
        "p50_ms": round(statistics.median(overheads) * 1000, 2),
        "p95_ms": round(overheads[int(0.95 * (len(overheads) - 1))] * 1000, 2),
        "elapsed_s": round(elapsed, 3),
        "ideal_s": round(ideal, 3),
        "ratio": round(elapsed / ideal, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    os.environ["HERON_HOME"] = tempfile.mkdtemp(prefix="heron-bench-")
    results = {}
    for n in LEVELS:
        results[str(n)] = asyncio.run(measure(n, args.turns, args.latency_ms / 1000))
    if args.json:
        print(json.dumps(results))
        return
    print(f"latency {args.latency_ms:.0f} ms, {args.turns} turns per conversation")
    print(
        f"{'convs':>6} {'turns/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'total s':>8} "
        f"{'ideal s':>8} {'x ideal':>8}"
    )
    for n, r in results.items():
        print(
            f"{n:>6} {r['turns_per_s']:>9} {r['p50_ms']:>8} {r['p95_ms']:>8} "
            f"{r['elapsed_s']:>8} {r['ideal_s']:>8} {r['ratio']:>8}"
        )
    ok = results["100"]["ratio"] <= 1.2
    print(
        f"target (100 conversations within 1.2x ideal): {'met' if ok else 'NOT met'}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
