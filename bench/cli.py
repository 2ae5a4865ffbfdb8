"""Wall time of one `heron run` message, through a running `heron serve` and in-process.

Two homes hold the same 30-message conversation; one has a `heron serve` running on it. Each
round runs the real `heron run --conversation bench "..."` command once on each home
(interleaved, so a drifting machine load lands on both alike), against a fake
chat-completions server on 127.0.0.1 that answers at once. The figures are medians of the
wall time of the whole command, process start to exit.

    python bench/cli.py [--runs 15] [--json]

Target: through serve <= 150 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from heron.messages import Message, Text
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

PRIOR = 30


def seed(home: Path) -> None:
    """The conversation 'bench' with PRIOR messages, user and assistant in turn."""
    store = Store(home / "heron.db")
    conversation = store.open_conversation("bench")
    for i in range(PRIOR):
        role = "user" if i % 2 == 0 else "assistant"
        store.append(conversation.id, Message(role, [Text(f"message {i}: " + "words " * 20)]))
    store.close()


def environment(home: Path, url: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
    }
    env.update(HERON_HOME=str(home), HERON_BASE_URL=url, HERON_API_KEY="d")
    env["HERON_MODEL"] = "fake-model"
    return env


def start_serve(env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "heron", "serve", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    banner = proc.stdout.readline()  # printed once it listens
    if not banner.startswith("heron serve: "):
        raise SystemExit(f"heron serve did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc


def one_run(env: dict[str, str], i: int) -> float:
    command = [sys.executable, "-m", "heron", "run", "--conversation", "bench", f"next message {i}"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"heron run failed: {done.stderr}")
    return took


def measure(runs: int) -> dict[str, float]:
    instant = FakeOpenAIServer(lambda body: ServerReply("ok"))
    with tempfile.TemporaryDirectory() as tmp, instant as model:
        served, alone = Path(tmp, "served"), Path(tmp, "alone")
        for home in (served, alone):
            home.mkdir()
            seed(home)
        served_env = environment(served, model.base_url)
        alone_env = environment(alone, model.base_url)
        serve = start_serve(served_env)
        try:
            one_run(served_env, -1), one_run(alone_env, -1)  # warm the caches of both
            times: dict[str, list[float]] = {"serve": [], "inprocess": []}
            for i in range(runs):
                times["serve"].append(one_run(served_env, i))
                times["inprocess"].append(one_run(alone_env, i))
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
    return {f"{k}_ms": round(statistics.median(v) * 1000, 1) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="measured runs per mode")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    figures = measure(args.runs)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"heron run continuing a {PRIOR}-message conversation (median of {args.runs}):")
    print(f"  through heron serve: {figures['serve_ms']:8.1f} ms   (target <= 150 ms)")
    print(f"  in-process:          {figures['inprocess_ms']:8.1f} ms")


if __name__ == "__main__":
    main()
