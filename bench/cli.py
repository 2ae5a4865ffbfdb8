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

With --big, a fresh `heron serve` on a big home, started again for every round on a fresh copy
of it: QA17f's home of 91,682 messages (a conversation of 10,000 turns, 8 of 1,500, 300 of 60;
a tool call every 7th turn), every conversation idle for an hour, so the serve finds all of them
to consolidate. Per round: the serve's start (process start to its banner), then at once the
first `heron run` (a new two-message conversation each), LATER more back to back, and PAUSED more
each after a 3-second pause (what idle-time work may use); then the same on a home of one short
conversation, the reference at the same load. `--json` prints `{"start_ms", "first_ms",
"later_ms", "paused_ms", "small_start_ms", ..., "rounds", "messages"}`, medians over the
rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from heron.messages import Message, Text, ToolCall, ToolResult, parts_to_json
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


# The big home (--big): conversations and their turns, as QA17f's generator made them.
BIG_PLAN = [("giant", 10_000)] + [(f"large-{i}", 1_500) for i in range(8)]
BIG_PLAN += [(f"conv-{i:03d}", 60) for i in range(300)]
LATER, PAUSED, PAUSE_S = 4, 3, 3.0


def _turn(key: str, t: int) -> list[Message]:
    """One turn's messages: the question, a tool call and its result every 7th turn, a reply."""
    words = [
        "heron",
        "river",
        "fish",
        "patience",
        "garden",
        "passport",
        "invoice",
        "budget",
        "python",
        "kernel",
    ]
    said = " ".join(words[(t * 7 + i) % len(words)] for i in range(5 + t % 30))
    out = [Message("user", [Text(f"[{key} #{t}] {said}.")])]
    if t % 7 == 3:
        call = f"call_{key}_{t}"
        out.append(Message("assistant", [ToolCall(call, "bash", {"command": f"echo {t}"})]))
        out.append(Message("user", [ToolResult(call, f"{t}\n[exit code 0]")]))
    out.append(Message("assistant", [Text(" ".join([said.capitalize() + "."] * (1 + t % 5)))]))
    return out


def seed_big(home: Path) -> int:
    """BIG_PLAN's conversations, last touched an hour ago; returns the messages written."""
    store = Store(home / "heron.db")
    hour_ago = time.time() - 3600
    row_id = 0
    for key, turns in BIG_PLAN:
        conversation = store.open_conversation(key)
        rows, parent = [], None
        for t in range(turns):
            for message in _turn(key, t):
                row_id += 1
                rows.append(
                    (row_id, conversation.id, parent, message.role, parts_to_json(message.parts))
                )
                parent = row_id
        with store.transaction() as c:
            c.executemany(
                "INSERT INTO messages (id, conversation_id, parent_id, role, parts, created)"
                f" VALUES (?, ?, ?, ?, ?, {hour_ago})",
                rows,
            )
            c.execute(
                "UPDATE conversations SET head_id = ?, updated = ?, title = ? WHERE id = ?",
                (parent, hour_ago, key, conversation.id),
            )
    store.close()
    return row_id


def new_conversation(env: dict[str, str], label: str) -> float:
    """One `heron run` opening a conversation of its own; its wall time in seconds."""
    command = [sys.executable, "-m", "heron", "run", "-c", f"new-{label}", f"hello {label}"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"heron run failed: {done.stderr}")
    return time.perf_counter() - started


def big_round(seeded: Path, home: Path, url: str, n: int) -> dict[str, list[float]]:
    """A fresh serve on a fresh copy of a seeded home, and the messages of one round."""
    shutil.copytree(seeded, home)
    env = environment(home, url)
    started = time.perf_counter()
    serve = start_serve(env)
    out: dict[str, list[float]] = {"start": [time.perf_counter() - started]}
    try:
        out["first"] = [new_conversation(env, f"{n}-0")]
        out["later"] = [new_conversation(env, f"{n}-{i}") for i in range(1, LATER + 1)]
        out["paused"] = []
        for i in range(PAUSED):
            time.sleep(PAUSE_S)
            out["paused"].append(new_conversation(env, f"{n}-p{i}"))
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    shutil.rmtree(home)
    return out


def measure_big(rounds: int) -> dict[str, float]:
    instant = FakeOpenAIServer(lambda body: ServerReply("ok"))
    with tempfile.TemporaryDirectory() as tmp, instant as model:
        seeded = Path(tmp, "seeded")
        seeded.mkdir()
        messages = seed_big(seeded)
        small = Path(tmp, "small")  # the reference: one short conversation
        small.mkdir()
        seed(small)
        for home in (seeded, small):
            # Used once in-process, as a home has been: what a first run on a home does once
            # (the sandbox probe) is no part of a serve's first message.
            one_run(environment(home, model.base_url), -1)
        times: dict[str, list[float]] = {}
        for n in range(rounds):  # the big home and the small one in turn, alike in load
            for prefix, home in (("", seeded), ("small_", small)):
                for name, took in big_round(home, Path(tmp, "home"), model.base_url, n).items():
                    times.setdefault(prefix + name, []).extend(took)
    figures = {f"{k}_ms": round(statistics.median(v) * 1000, 1) for k, v in times.items()}
    return {**figures, "rounds": rounds, "messages": messages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, help="measured runs per mode (15; offline 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--offline", action="store_true", help="the offline model: echo hi | heron run -"
    )
    parser.add_argument(
        "--big", action="store_true", help="first and later messages of a fresh serve, big home"
    )
    args = parser.parse_args()
    if args.big:
        big = measure_big(args.runs or 3)
        if args.json:
            print(json.dumps(big))
            return
        print(f"a fresh heron serve on a home of {big['messages']:,} messages, new conversations")
        print(f"(medians of {big['rounds']} rounds):")
        print(f"  serve start, to its banner:      {big['start_ms']:8.1f} ms")
        print(f"  the first message, at once:      {big['first_ms']:8.1f} ms")
        print(f"  the next {LATER}, back to back:       {big['later_ms']:8.1f} ms")
        print(f"  {PAUSED} more, each after {PAUSE_S:g} s:        {big['paused_ms']:8.1f} ms")
        print(f"the same on a home of one {PRIOR}-message conversation, rounds in turn:")
        print(f"  serve start, to its banner:      {big['small_start_ms']:8.1f} ms")
        print(f"  the first message, at once:      {big['small_first_ms']:8.1f} ms")
        print(f"  the next {LATER}, back to back:       {big['small_later_ms']:8.1f} ms")
        print(f"  {PAUSED} more, each after {PAUSE_S:g} s:        {big['small_paused_ms']:8.1f} ms")
        return
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
