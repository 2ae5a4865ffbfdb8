"""Wall time of one `heron run` message, through a running `heron serve` and in-process.

Two homes hold the same 30-message conversation; one has a `heron serve` running on it. Each
round runs the real `heron run --conversation bench "..."` command once on each home
(interleaved, so a drifting machine load lands on both alike), against a fake
chat-completions server on 127.0.0.1 that answers at once. The figures are medians of the
wall time of the whole command, process start to exit.

    python bench/cli.py [--runs 15] [--json]

Target: through serve <= 150 ms.

With --offline, the model is the offline one (SmolLM2 through xllamacpp, no API key and no
base URL in the environment), and each round is `echo hi | heron run -` (a new thread each
time): through a serve that loaded the model once, against a process that loads it for every
message. `--json` prints `{"offline_serve_ms": .., "offline_inprocess_ms": ..}`.
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


def environment(home: Path, url: str | None) -> dict[str, str]:
    """The environment of a run on `home`: the fake server at `url`, or (None) no model
    configured at all, so Heron picks the offline one."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
    }
    env["HERON_HOME"] = str(home)
    if url is not None:
        env.update(HERON_BASE_URL=url, HERON_API_KEY="d", HERON_MODEL="fake-model")
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


def one_run(env: dict[str, str], i: int, offline: bool = False) -> float:
    command = [sys.executable, "-m", "heron", "run", "--conversation", "bench", f"next message {i}"]
    stdin = None
    if offline:  # `echo hi | heron run -`: the message on stdin, a new thread each time
        command, stdin = [sys.executable, "-m", "heron", "run", "-"], "hi\n"
    started = time.perf_counter()
    done = subprocess.run(
        command, env=env, input=stdin, capture_output=True, text=True, timeout=300
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"heron run failed: {done.stderr}")
    return took


def measure(runs: int, offline: bool = False) -> dict[str, float]:
    instant = FakeOpenAIServer(lambda body: ServerReply("ok"))
    with tempfile.TemporaryDirectory() as tmp, instant as model:
        served, alone = Path(tmp, "served"), Path(tmp, "alone")
        for home in (served, alone):
            home.mkdir()
            seed(home)
        url = None if offline else model.base_url
        served_env, alone_env = environment(served, url), environment(alone, url)
        serve = start_serve(served_env)
        try:
            # Warm the caches of both (and, offline, the serve's model: its first request
            # waits for the model to load).
            one_run(served_env, -1, offline), one_run(alone_env, -1, offline)
            times: dict[str, list[float]] = {"serve": [], "inprocess": []}
            for i in range(runs):
                times["serve"].append(one_run(served_env, i, offline))
                times["inprocess"].append(one_run(alone_env, i, offline))
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
    prefix = "offline_" if offline else ""
    return {f"{prefix}{k}_ms": round(statistics.median(v) * 1000, 1) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, help="measured runs per mode (15; offline 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--offline", action="store_true", help="the offline model: echo hi | heron run -"
    )
    args = parser.parse_args()
    runs = args.runs or (5 if args.offline else 15)
    figures = measure(runs, args.offline)
    if args.json:
        print(json.dumps(figures))
        return
    if args.offline:
        print(f"echo hi | heron run - on the offline model (median of {runs}):")
        print(f"  through heron serve (model loaded once): {figures['offline_serve_ms']:8.1f} ms")
        print(
            f"  in-process (model loaded every time):    {figures['offline_inprocess_ms']:8.1f} ms"
        )
        return
    print(f"heron run continuing a {PRIOR}-message conversation (median of {runs}):")
    print(f"  through heron serve: {figures['serve_ms']:8.1f} ms   (target <= 150 ms)")
    print(f"  in-process:          {figures['inprocess_ms']:8.1f} ms")


if __name__ == "__main__":
    main()
