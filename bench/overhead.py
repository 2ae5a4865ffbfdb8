"""Engine overhead of `heron run`: process start to first model request, reply to exit.

For conversations with 10, 1,000 and 10,000 prior messages, a fresh process runs the `heron run`
code path (config, store, history, prompt, runner, persistence) several times; the figures are
medians. The main figures use an instant in-process provider, so they measure Heron itself.
A second line per size runs the real `heron run` command against a fake chat-completions server
on 127.0.0.1 through the OpenAI adapter, which adds the SDK's import (several hundred ms) and the
HTTP round trip. Peak RSS is the largest child's.

    python bench/overhead.py [--runs 5] [--json]

Targets: first request within 300 ms of process start; the 10,000-message figure within 1.5x
of the 10-message one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from heron.messages import Message, Text, ToolCall, ToolResult, parts_to_json
from heron.store import Store

SIZES = (10, 1000, 10000)


def seed(home: Path, n: int) -> None:
    """A conversation 'bench' with n prior messages: user/assistant pairs, some with tools."""
    store = Store(home / "heron.db")
    conv = store.open_conversation("bench")
    rows, parent = [], None
    now = time.time()
    for i in range(n):
        msg = _message(i)
        rows.append((i + 1, conv.id, parent, msg.role, parts_to_json(msg.parts), now))
        parent = i + 1
    with store.transaction() as c:
        c.executemany(
            "INSERT INTO messages (id, conversation_id, parent_id, role, parts, created)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        c.execute("UPDATE conversations SET head_id = ? WHERE id = ?", (parent, conv.id))
    store.close()


def _message(i: int) -> Message:
    if i % 2 == 0:
        if i % 10 == 8:
            return Message("user", [ToolResult(f"c{i - 1}", f"result {i}: " + "x" * 80)])
        return Message("user", [Text(f"Question {i}: what about item {i}?")])
    if i % 10 == 7:
        return Message("assistant", [ToolCall(f"c{i}", "read_file", {"path": f"f{i}.txt"})])
    return Message("assistant", [Text(f"Answer {i}: item {i} is fine, nothing to add.")])


def child(home: str) -> None:
    """Runs in the measured process: `heron run`'s code path with an instant provider; prints
    when the request reached the provider."""
    import asyncio

    from heron.channels.script import run_once
    from heron.config import Settings
    from heron.messages import Reply
    from heron.providers.scripted import ScriptedProvider

    arrived: list[float] = []

    def answer(request: object) -> Reply:
        arrived.append(time.time())
        return Reply([Text("ok")], "done")

    os.environ["HERON_HOME"] = home
    provider = ScriptedProvider(answer, model="instant")
    devnull = open(os.devnull, "w")  # noqa: SIM115
    ok = asyncio.run(
        run_once(
            Settings.load(),
            "hello",
            "default",
            "bench",
            None,
            False,
            devnull,
            devnull,
            provider=provider,
        )
    )
    print(json.dumps({"arrived": arrived[0], "ok": ok}), flush=True)


def _installed_env() -> dict[str, str]:
    """The environment of an installed Heron: bytecode caches written and read, as they are for
    anyone who ran it once (a development shell may set PYTHONDONTWRITEBYTECODE, which would
    make every start recompile every module). The warm-up run writes the caches."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def measure_instant(home: Path, window: int) -> tuple[float, float, float]:
    start = time.time()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**_installed_env(), "HERON_CONTEXT_WINDOW": str(window)},
    )
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    end = time.time()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    arrived = json.loads(out)["arrived"]
    return (arrived - start) * 1000, (end - arrived) * 1000, usage.ru_maxrss / 1024


def measure(home: Path, url: str, arrivals: list[float]) -> tuple[float, float, float]:
    env = {k: v for k, v in _installed_env().items() if not k.startswith(("HERON_", "OPENAI"))}
    env.update(
        HERON_HOME=str(home),
        HERON_BASE_URL=url,
        HERON_API_KEY="bench",
        HERON_MODEL="bench-model",
        # Large enough that no compaction runs: this measures the engine, not a summary call.
        HERON_CONTEXT_WINDOW="100000000",
    )
    before = len(arrivals)
    start = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "heron", "run", "-c", "bench", "hello"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    end = time.time()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or len(arrivals) != before + 1:
        raise SystemExit(f"heron run failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    arrived = arrivals[-1]
    return (arrived - start) * 1000, (end - arrived) * 1000, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per size (median reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--window",
        type=int,
        default=100_000_000,
        help="context window in tokens (default: so large that every prior message is sent and "
        "no compaction runs; 128000 shows a long conversation as it really runs, compacted)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    # Imported here, not at the top: the measured child runs this file, and the fake server
    # (http.server and its imports) is no part of `heron run`'s start-up.
    from heron.testing.fake_openai import FakeOpenAIServer
    from heron.testing.script import ServerReply

    arrivals: list[float] = []

    def answer(body: dict) -> ServerReply:
        arrivals.append(time.time())
        return ServerReply(text="ok", input_tokens=10, output_tokens=1)

    first, after, peak = {}, {}, 0.0
    wire_first, wire_after = {}, {}
    with FakeOpenAIServer(answer) as server, tempfile.TemporaryDirectory() as tmp:
        for n in SIZES:
            home = Path(tmp) / f"h{n}"
            home.mkdir()
            seed(home, n)
            measure_instant(home, args.window)  # warm the OS file cache
            runs = [measure_instant(home, args.window) for _ in range(args.runs)]
            first[str(n)] = round(statistics.median(r[0] for r in runs), 1)
            after[str(n)] = round(statistics.median(r[1] for r in runs), 1)
            peak = max(peak, *(r[2] for r in runs))
            wire = [measure(home, server.base_url, arrivals) for _ in range(args.runs)]
            wire_first[str(n)] = round(statistics.median(r[0] for r in wire), 1)
            wire_after[str(n)] = round(statistics.median(r[1] for r in wire), 1)
            if not args.json:
                print(
                    f"{n:>6} prior messages: first request {first[str(n)]:7.1f} ms, "
                    f"reply to exit {after[str(n)]:6.1f} ms  |  through the OpenAI SDK and "
                    f"loopback HTTP: {wire_first[str(n)]:7.1f} ms, {wire_after[str(n)]:6.1f} ms"
                )
    result = {
        "first_request_ms": first,
        "reply_to_exit_ms": after,
        "peak_rss_mb": round(peak, 1),
        "openai_wire": {"first_request_ms": wire_first, "reply_to_exit_ms": wire_after},
    }
    if args.json:
        print(json.dumps(result))
    else:
        ratio = first["10000"] / first["10"]
        print(f"peak RSS {result['peak_rss_mb']} MB; 10,000 vs 10 messages: {ratio:.2f}x")


if __name__ == "__main__":
    main()
