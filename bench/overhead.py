"""Engine overhead of `heron run`: process start to first model request, reply to exit.

For conversations with 10, 1,000 and 10,000 prior messages, a fresh process runs the `heron run`
code path (config, store, history, prompt, runner, persistence) several times; the figures are
medians. The main figures use an instant in-process provider, so they measure Heron itself.

Each size runs in two modes, each on its own copy of the conversation:

- realistic: the default model profile's context window (128,000 tokens), so a long
  conversation is consolidated as it really runs (the warm-up run folds it, the measured runs
  continue it). The targets are judged on this mode.
- all sent: a window so large that no compaction runs and every prior message is sent.

The runs are interleaved (one of every size and mode per round), so a drifting machine load
lands on all of them alike instead of on the ratio between sizes.

A third pair of figures per size runs the real `heron run` command (realistic mode) against a
fake chat-completions server on 127.0.0.1 through the OpenAI adapter, which adds the SDK's
import (several hundred ms) and the HTTP round trip. Peak RSS is the largest child's, per mode.

    python bench/overhead.py [--runs 5] [--json] [--sizes 10,10000] [--no-wire]
    python bench/overhead.py --auto-recall /work/shared/eval/locomo-dev.json [--auto-recall-only]

With --auto-recall, also what auto-recall adds to a turn over 100,000 stored messages
(`--recall-messages`): bench/recall.py's synthetic history of the file's turns over 200
conversations, and the step a turn runs inline before the model call (`wiring.recall_rows`:
the gate, and for a message that passes it the in-view set, the ranking and the two stored
rows), for each of its questions typed in one of the conversations in turn; BM25 path (the
fused one needs every message embedded: bench/recall.py does it from its vector cache). Warm:
the conversation's branch read before the step, as a turn reads it for its view anyway (what
auto-recall adds; the target is judged on it); cold: read inside the step (the first message to
a conversation since the process started). Each as wall time and as the CPU time of the step's
thread, which on a busy machine leaves out the waits for a core.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


ALL_SENT = 100_000_000  # tokens: no compaction runs, every prior message is sent


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


def measure(home: Path, url: str, window: int, arrivals: list[float]) -> tuple[float, float, float]:
    env = {k: v for k, v in _installed_env().items() if not k.startswith(("HERON_", "OPENAI"))}
    env.update(
        HERON_HOME=str(home),
        HERON_BASE_URL=url,
        HERON_API_KEY="bench",
        HERON_MODEL="bench-model",
        HERON_CONTEXT_WINDOW=str(window),
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


def _medians(runs: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return (
        round(statistics.median(r[0] for r in runs), 1),
        round(statistics.median(r[1] for r in runs), 1),
        max(r[2] for r in runs),
    )


def _interleaved(
    cases: list[tuple[str, Path, int]], runs: int
) -> dict[str, list[tuple[float, float, float]]]:
    """Each case (label, home, window) is measured `runs` times, one run of every case per
    round: this machine's load drifts, and measuring one size after another would put the
    drift into the ratio between sizes."""
    out: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _, _ in cases}
    for _ in range(runs):
        for label, home, window in cases:
            out[label].append(measure_instant(home, window))
    return out


def _verdict(first: dict[str, float], label: str) -> str:
    if "10" not in first or "10000" not in first:
        return f"{label}: needs sizes 10 and 10000 for the ratio"
    ratio = first["10000"] / first["10"]
    ok = ratio <= 1.5 and max(first.values()) <= 300
    worst = max(first.values())
    return (
        f"{label}: slowest first request {worst:.1f} ms (target <= 300), 10,000 vs 10 messages "
        f"{ratio:.2f}x (target <= 1.5x): {'MET' if ok else 'NOT MET'}"
    )


# ---- the sandbox (docs/security.md) -----------------------------------------------------------

SANDBOX_KILL_CHILD = """\
import asyncio, sys
from pathlib import Path
from heron.tools.sandbox import Sandbox
from heron.tools.shell import run_command
asyncio.run(run_command(sys.argv[2], Sandbox(Path(sys.argv[1])), 3600, 1000))
"""


def sandbox_figures(runs: int = 20) -> dict[str, float]:
    """A `bash` call (`true`) and a kernel start, plain, unconfined (the wrapper) and in the
    sandbox; and how long a sleep started in the sandbox outlives a SIGKILLed Heron. Medians
    in ms. Targets: the sandbox adds at most 30 ms to a bash call, 1 s to a kernel start;
    `network = "loopback"` (pasta) is measured apart."""
    import asyncio
    import shutil

    from heron.tools.python_kernel import KernelSession
    from heron.tools.sandbox import Sandbox, find_pasta
    from heron.tools.shell import run_command

    if shutil.which("bwrap") is None:
        return {}

    class Plain(Sandbox):
        """What every call ran before the sandbox: bash itself, nothing around it."""

        def wrap(
            self, argv: Sequence[str], *, binds: Sequence[Path] = (), seccomp: int | None = None
        ) -> list[str]:
            return list(argv)

    async def bash_ms(sandbox: Sandbox) -> float:
        started = time.perf_counter()
        await run_command("true", sandbox, 60, 1000)  # the bash tool's own path
        return (time.perf_counter() - started) * 1000

    async def kernel_ms(sandbox: Sandbox) -> float:
        kernel = KernelSession(sandbox.workspace, sandbox=sandbox)
        started = time.perf_counter()
        await kernel.start()
        took = (time.perf_counter() - started) * 1000
        await kernel.shutdown()
        return took

    async def measure(workspace: Path) -> dict[str, float]:
        home = workspace.parent
        modes = {
            "plain": Plain(workspace, home, bwrap=None),
            "unconfined": Sandbox(workspace, home, bwrap=None),
            "sandbox": Sandbox(workspace, home),
        }
        if pasta := find_pasta(os.environ):  # network = "loopback": pasta joins each command
            modes["loopback"] = Sandbox(workspace, home, "loopback", pasta=pasta)
        bash: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(runs):  # interleaved, so load drift lands on every mode alike
            for mode, sandbox in modes.items():
                bash[mode].append(await bash_ms(sandbox))
        kernel: dict[str, list[float]] = {"unconfined": [], "sandbox": []}
        for _ in range(max(3, runs // 5)):
            for mode in kernel:
                kernel[mode].append(await kernel_ms(modes[mode]))
        out = {f"bash_{m}_ms": round(statistics.median(v), 1) for m, v in bash.items()}
        out |= {f"kernel_start_{m}_ms": round(statistics.median(v), 1) for m, v in kernel.items()}
        return out

    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "home" / "workspace"
        workspace.mkdir(parents=True)
        out = asyncio.run(measure(workspace))
        kills = [_sandbox_kill_ms(workspace, i) for i in range(3)]
    out["bash_added_ms"] = round(out["bash_sandbox_ms"] - out["bash_plain_ms"], 1)
    if "bash_loopback_ms" in out:
        out["loopback_added_ms"] = round(out["bash_loopback_ms"] - out["bash_sandbox_ms"], 1)
    added = out["kernel_start_sandbox_ms"] - out["kernel_start_unconfined_ms"]
    out["kernel_start_added_ms"] = round(added, 1)
    out["sleep_outlives_sigkill_ms"] = round(statistics.median(kills), 1)
    return out


def _sandbox_kill_ms(workspace: Path, n: int) -> float:
    """SIGKILL a process that runs `sleep` in the sandbox; ms until the sleep is gone."""
    import signal

    duration = f"100.{os.getpid():07d}{n}"
    child = subprocess.Popen(
        [sys.executable, "-c", SANDBOX_KILL_CHILD, str(workspace), f"sleep {duration} & wait"]
    )
    deadline = time.monotonic() + 60
    while not _sleeping(duration) and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    started = time.perf_counter()
    while _sleeping(duration) and time.perf_counter() - started < 30:
        time.sleep(0.001)
    took = (time.perf_counter() - started) * 1000
    child.wait()
    return took


def _sleeping(duration: str) -> bool:
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argv[:2] == [b"sleep", duration.encode()] and state != "Z":
            return True
    return False


def _print_sandbox(figures: dict[str, float]) -> None:
    if not figures:
        print("sandbox: bwrap is not installed, no figures")
        return
    f = figures
    print(
        f"sandbox: bash call {f['bash_plain_ms']:.1f} ms plain, {f['bash_unconfined_ms']:.1f} "
        f"unconfined, {f['bash_sandbox_ms']:.1f} sandboxed (+{f['bash_added_ms']:.1f}, target "
        f"<= 30: {'MET' if f['bash_added_ms'] <= 30 else 'NOT MET'}); kernel start "
        f"{f['kernel_start_unconfined_ms']:.0f} ms unconfined, "
        f"{f['kernel_start_sandbox_ms']:.0f} sandboxed (+{f['kernel_start_added_ms']:.0f}, "
        f"target <= 1000: {'MET' if f['kernel_start_added_ms'] <= 1000 else 'NOT MET'}); a "
        f"sleep outlives a SIGKILLed Heron by {f['sleep_outlives_sigkill_ms']:.1f} ms"
    )
    if "bash_loopback_ms" in f:
        print(
            f'sandbox, network = "loopback": bash call {f["bash_loopback_ms"]:.1f} ms '
            f"(+{f['loopback_added_ms']:.1f} over the sandbox, for pasta)"
        )


def auto_recall_figures(locomo: Path, total: int, queries: int = 300) -> dict[str, object]:
    """p50/p95 of the auto-recall step a turn adds over `total` messages (see the module
    docstring), and the share of turns it fired on."""
    import importlib.util
    import random

    from heron.memory.recall import Recall

    spec = importlib.util.spec_from_file_location(
        "recall_bench", Path(__file__).with_name("recall.py")
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    raw = json.loads(locomo.read_text())
    rng = random.Random(7)  # the same history and questions as bench/recall.py's latency
    texts = bench.synthesise(raw, total, rng)
    asked = [
        rng.choice([qa["question"] for s in raw for qa in s["qa"]]) for _ in range(queries + 1)
    ]
    figures: dict[str, object] = {}
    for warm in (False, True):  # each on a history of its own: the steps add rows
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "auto.db")
            bench.fill(store, texts)
            timed = bench.auto_timed(store, Recall(store), asked, warm=warm)
            store.close()
        if warm:
            figures["warm"] = {k: timed[k] for k in ("p50", "p95", "cpu")}
        else:
            figures.update(timed)
    return {**figures, "messages": total, "path": "bm25", "target_p95_ms": 10.0}


def _print_auto(figures: dict[str, object]) -> None:
    warm: dict[str, Any] = figures["warm"]  # type: ignore[assignment]
    cold_cpu: dict[str, float] = figures["cpu"]  # type: ignore[assignment]
    verdict = "met" if float(warm["p95"]) < 10.0 else "NOT met"
    print(
        f"auto-recall adds to a turn over {figures['messages']:,} messages ({figures['path']}),"
        f" fired on {figures['fired']:.0%}: with the conversation's branch read already, as a"
        f" turn reads it for its view: p50 {warm['p50']} ms, p95 {warm['p95']} ms (target p95"
        f" < 10 ms: {verdict}; CPU p50 {warm['cpu']['p50']} / p95 {warm['cpu']['p95']} ms);"
        f" the first message to a conversation since the process started, the branch read"
        f" inside the step: p50 {figures['p50']} ms, p95 {figures['p95']} ms (CPU p50"
        f" {cold_cpu['p50']} / p95 {cold_cpu['p95']} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per size and mode (median)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--window",
        type=int,
        help="the realistic mode's context window in tokens (default: the default model "
        "profile's, 128000)",
    )
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="prior messages")
    parser.add_argument("--no-wire", action="store_true", help="skip the OpenAI SDK runs")
    parser.add_argument("--no-offline", action="store_true", help="skip the offline model")
    parser.add_argument("--offline-only", action="store_true", help="only the offline model")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sandbox-only", action="store_true", help="only the sandbox figures")
    parser.add_argument(
        "--auto-recall", type=Path, metavar="LOCOMO", help="also time auto-recall (a LoCoMo file)"
    )
    parser.add_argument("--auto-recall-only", action="store_true", help="only auto-recall")
    parser.add_argument("--recall-messages", type=int, default=100_000, help="for auto-recall")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if args.sandbox_only:
        figures = sandbox_figures()
        if args.json:
            print(json.dumps({"sandbox": figures}))
        else:
            _print_sandbox(figures)
        return
    if args.auto_recall_only:
        if args.auto_recall is None:
            parser.error("--auto-recall-only needs --auto-recall LOCOMO (a LoCoMo JSON file)")
        figures = auto_recall_figures(args.auto_recall, args.recall_messages)
        if args.json:
            print(json.dumps({"auto_recall_ms": figures}))
        else:
            _print_auto(figures)
        return
    if args.offline_only:
        figures = offline_model(min(args.runs, 3))
        if args.json:
            print(json.dumps({"offline_model": figures}))
        else:
            print_offline(figures)
        return
    # Imported here, not at the top: the measured child runs this file, and the fake server
    # (http.server and its imports) is no part of `heron run`'s start-up.
    from heron.providers.profiles import ModelProfile
    from heron.testing.fake_openai import FakeOpenAIServer
    from heron.testing.script import ServerReply

    arrivals: list[float] = []

    def answer(body: dict) -> ServerReply:
        arrivals.append(time.time())
        return ServerReply(text="ok", input_tokens=10, output_tokens=1)

    args.window = args.window or ModelProfile().context_window
    sizes = [int(x) for x in args.sizes.split(",")]
    cases: list[tuple[str, Path, int]] = []
    wire_first, wire_after = {}, {}
    with FakeOpenAIServer(answer) as server, tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for mode, window in (("real", args.window), ("all", ALL_SENT)):
                home = Path(tmp) / f"{mode}{n}"
                home.mkdir()
                seed(home, n)
                # Warm-up: the file cache, bytecode, and in the realistic mode the
                # consolidation a long conversation gets (the measured runs continue it).
                measure_instant(home, window)
                cases.append((f"{mode}{n}", home, window))
        runs = _interleaved(cases, args.runs)
        if not args.no_wire:  # the realistic homes, after the instant runs
            for n in sizes:
                wire = [
                    measure(Path(tmp) / f"real{n}", server.base_url, args.window, arrivals)
                    for _ in range(3)
                ]
                wire_first[str(n)], wire_after[str(n)], _ = _medians(wire)
    first, after, first_all, after_all = {}, {}, {}, {}
    peak, peak_all = 0.0, 0.0
    for n in sizes:
        key = str(n)
        first[key], after[key], rss = _medians(runs[f"real{n}"])
        peak = max(peak, rss)
        first_all[key], after_all[key], rss = _medians(runs[f"all{n}"])
        peak_all = max(peak_all, rss)
        if not args.json:
            wire = ""
            if key in wire_first:
                wire = f" | OpenAI SDK + HTTP {wire_first[key]:7.1f}, {wire_after[key]:6.1f}"
            print(
                f"{n:>6} prior messages: realistic first request {first[key]:6.1f} ms, "
                f"reply to exit {after[key]:6.1f} | all sent {first_all[key]:6.1f}, "
                f"{after_all[key]:6.1f}{wire}"
            )
    result = {
        "first_request_ms": first,
        "reply_to_exit_ms": after,
        "peak_rss_mb": round(peak, 1),
        "window": args.window,
        "first_request_ms_all_sent": first_all,
        "reply_to_exit_ms_all_sent": after_all,
        "peak_rss_mb_all_sent": round(peak_all, 1),
        "openai_wire": {"first_request_ms": wire_first, "reply_to_exit_ms": wire_after},
        "sandbox": sandbox_figures(),
    }
    if not args.no_offline:
        result["offline_model"] = offline_model(min(args.runs, 3))
    if args.auto_recall is not None:
        result["auto_recall_ms"] = auto_recall_figures(args.auto_recall, args.recall_messages)
    if args.json:
        print(json.dumps(result))
        return
    print(f"peak RSS {result['peak_rss_mb']} MB (all sent: {result['peak_rss_mb_all_sent']} MB)")
    print(_verdict(first, f"target, judged on the realistic mode (window {args.window})"))
    print(_verdict(first_all, f"for information, all sent (window {ALL_SENT})"))
    _print_sandbox(result["sandbox"])
    if not args.no_offline:
        print_offline(result["offline_model"])  # type: ignore[arg-type]
    if args.auto_recall is not None:
        _print_auto(result["auto_recall_ms"])  # type: ignore[arg-type]


# ---- the offline model ----------------------------------------------------------------------

OFFLINE_PROMPTS = (
    "hi",
    "What is the capital of France?",
    "What is 2+2?",
    "Name three colours.",
    "Thank you!",
    "What day comes after Monday?",
    "Tell me a joke.",
    "How many legs does a cat have?",
    "What is the opposite of hot?",
    "Say something nice.",
    "What is water made of?",
    "Who wrote Romeo and Juliet?",
    "What colour is the sky?",
    "Give me a fruit.",
    "How are you?",
    "What is the largest planet?",
    "Spell the word cat.",
    "What do bees make?",
    "Good night.",
    "bye",
)


def _offline_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in _installed_env().items() if not k.startswith(("HERON_", "OPENAI"))}
    env.pop("ANTHROPIC_API_KEY", None)
    env["HERON_HOME"] = str(home)
    return env


def _pty_chat(home: Path, question: str, wait_s: float) -> tuple[float, float]:
    """`heron chat` on a pseudo-terminal: seconds from start to the prompt, and from sending
    `question` (after `wait_s` more seconds at the prompt) to the first character of the answer."""
    import pty
    import re
    import select
    from collections.abc import Callable

    master, slave = pty.openpty()
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "heron", "chat", "--ephemeral"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=_offline_env(home),
        start_new_session=True,
    )
    os.close(slave)
    ansi = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\x1b[=>]|[\r\n]")

    def read_until(found: Callable[[bytes], bool], limit: float = 120.0) -> bytes:
        seen = b""
        deadline = time.monotonic() + limit
        while not found(ansi.sub(b"", seen)):
            if time.monotonic() > deadline:
                shown = ansi.sub(b"", seen).decode(errors="replace")
                raise SystemExit(f"heron chat: timed out; its screen ended with {shown[-400:]!r}")
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                seen += os.read(master, 65536)
        return seen

    try:
        read_until(lambda text: "›".encode() in text)
        prompt_s = time.monotonic() - start
        time.sleep(wait_s)
        os.write(master, question.encode() + b"\r")
        sent = time.monotonic()
        asked = question.encode()
        # The answer is whatever appears past the echoed question, once letters show.
        read_until(lambda text: asked in text and bool(re.search(rb"\w", text.split(asked)[-1])))
        first_s = time.monotonic() - sent
        mark = "›".encode()
        read_until(lambda text: mark in text.split(asked)[-1])  # the answer ended: the prompt
        os.write(master, b"\x04")  # Ctrl-D: leave
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return prompt_s, first_s


def _run_hi(home: Path) -> float:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "heron", "run", "-"],
        input=b"hi",
        env=_offline_env(home),
        capture_output=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(f"heron run failed: {done.stderr.decode()[-500:]}")
    return time.monotonic() - start


def _calls_per_turn(home: Path) -> dict[str, object]:
    """The 20 short prompts in one conversation of one engine, as a chat sends them."""
    import asyncio

    from heron.agent.engine import Engine
    from heron.config import Paths, Settings, load_config

    async def talk() -> list[tuple[int, str, float]]:
        settings = Settings(Paths(home), load_config(home / "config.toml"), _offline_env(home))
        out = []
        async with Engine.open(settings, ephemeral=True) as engine:
            for text in OFFLINE_PROMPTS:
                started = time.monotonic()
                result = await engine.turn("bench-offline", text)
                out.append((result.run.model_calls, result.run.stop, time.monotonic() - started))
        return out

    turns = asyncio.run(talk())
    stops: dict[str, int] = {}
    for _, stop, _ in turns:
        stops[stop] = stops.get(stop, 0) + 1
    return {
        "model_calls": [calls for calls, _, _ in turns],
        "stops": stops,
        "turn_s_median": round(statistics.median(s for _, _, s in turns), 2),
        "turn_s_max": round(max(s for _, _, s in turns), 2),
    }


def offline_model(runs: int) -> dict[str, object] | None:
    """The offline model's first-run figures; None when it is not installed.
    Targets: `echo hi | heron run -` < 10 s, chat start to prompt < 2 s, first token < 3 s,
    one model call per turn."""
    import importlib.util

    from heron.providers.local import find_smollm2

    if find_smollm2() is None or importlib.util.find_spec("xllamacpp") is None:
        return None
    question = "What is the capital of France?"
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        hi = [_run_hi(home) for _ in range(runs)]
        at_once = [_pty_chat(home, question, 0.0) for _ in range(runs)]
        typed = [_pty_chat(home, question, 5.0) for _ in range(runs)]  # a user types a while
        calls = _calls_per_turn(home)
    return {
        "run_hi_wall_s": round(statistics.median(hi), 2),
        "chat_start_to_prompt_s": round(statistics.median(p for p, _ in at_once + typed), 2),
        "first_token_sent_at_once_s": round(statistics.median(f for _, f in at_once), 2),
        "first_token_after_5s_s": round(statistics.median(f for _, f in typed), 2),
        "turns": calls,
    }


def print_offline(figures: dict[str, object] | None) -> None:
    if figures is None:
        print("offline model: not installed (make test installs it), skipped")
        return
    turns = figures["turns"]
    assert isinstance(turns, dict)
    print(
        f"offline model: echo hi | heron run - {figures['run_hi_wall_s']} s (target < 10); "
        f"heron chat start to prompt {figures['chat_start_to_prompt_s']} s (target < 2); first "
        f"token of the capital of France sent at once {figures['first_token_sent_at_once_s']} s, "
        f"after 5 s at the prompt {figures['first_token_after_5s_s']} s (target < 3)"
    )
    print(
        f"offline model, 20 short prompts in one chat: model calls per turn "
        f"{turns['model_calls']} (target 1 each), stops {turns['stops']}, turn median "
        f"{turns['turn_s_median']} s, slowest {turns['turn_s_max']} s"
    )


if __name__ == "__main__":
    main()
