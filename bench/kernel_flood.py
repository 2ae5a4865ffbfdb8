"""What a run_cell that floods its output costs: wall time against its timeout, peak memory of
Heron and of the kernel, and what the model reads of it (QA16b defect 2).

The cell is `while True: print("y" * 10000)` with a timeout (15 s unless `--timeout`), run
through the registry as a turn runs it: the real kernel, started through the sandbox launcher
(bubblewrap when it works). Reported: the call's wall time and its overrun past the timeout,
the peak RSS of this process (VmHWM) and of the kernel's processes (sampled every 50 ms, and
their own VmHWM at the end), the length of the result, its last line, and whether the variables
set before the flood were still there after it. Each run is a fresh process, so run it
alternately against two trees to compare them (PYTHONPATH=<other tree> takes that one's heron):

    python bench/kernel_flood.py [--timeout 15] [--runs 1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FLOOD = 'while True: print("y" * 10000)'


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            found.append(kid)
            todo.append(kid)
    return found


def _status_kb(pid: int | str, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """The largest summed RSS of this process's descendants (the kernel and its launcher), and
    the largest VmHWM any of them reported."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_kb = 0
        self.hwm_kb = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(0.05)

    def sample(self) -> None:
        kids = _descendants(os.getpid())
        self.peak_kb = max(self.peak_kb, sum(_status_kb(p, "VmRSS") for p in kids))
        self.hwm_kb = max([self.hwm_kb, *(_status_kb(p, "VmHWM") for p in kids)])


async def one_run(timeout: int) -> dict[str, object]:
    from heron.messages import ToolCall
    from heron.tools.context import ToolContext
    from heron.tools.python_kernel import run_cell
    from heron.tools.registry import ToolRegistry
    from heron.tools.sandbox import Sandbox

    root = Path(tempfile.mkdtemp(prefix="heron-flood-"))
    workspace, home = root / "home" / "workspace", root / "home"
    workspace.mkdir(parents=True)
    sandbox = Sandbox.detect(workspace, home, "none", os.environ)
    ctx = ToolContext(workspace=workspace, sandbox=sandbox)
    ctx.services.home = home
    registry = ToolRegistry([run_cell])

    async def cell(code: str, seconds: int) -> str:
        result = await registry.call(
            ToolCall("c", "run_cell", {"code": code, "timeout": seconds}), ctx
        )
        return result.content

    sampler = Sampler()
    try:
        await cell("kept = 'still here'", 30)
        sampler.start()
        started = time.monotonic()
        content = await cell(FLOOD, timeout)
        wall = time.monotonic() - started
        sampler.sample()
        after = await cell("kept", 30)
    finally:
        sampler.done.set()
        await ctx.aclose()
        subprocess.run(["rm", "-rf", str(root)], check=False)
    return {
        "wall_s": round(wall, 2),
        "overrun_s": round(wall - timeout, 2),
        "heron_peak_mb": round(_status_kb("self", "VmHWM") / 1024, 1),
        "kernel_peak_mb": round(max(sampler.peak_kb, sampler.hwm_kb) / 1024, 1),
        "result_chars": len(content),
        "last_line": content.rstrip().splitlines()[-1][:160],
        "variables_kept": "still here" in after,
        "confined": sandbox.confined,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=int, default=15)
    parser.add_argument("--runs", type=int, default=1, help="fresh processes, one after another")
    parser.add_argument("--json", action="store_true", help="one JSON line of the figures")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(one_run(args.timeout))))
        return
    runs = []
    for _ in range(args.runs):
        load = Path("/proc/loadavg").read_text().split()[0]
        argv = [sys.executable, __file__, "--child", "--timeout", str(args.timeout)]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures["load"] = float(load)
        runs.append(figures)
    import heron

    where = str(Path(heron.__file__).parent)
    if args.json:
        print(json.dumps({"heron": where, "timeout_s": args.timeout, "runs": runs}))
        return
    print(f"heron from {where}; cell {FLOOD!r}, timeout {args.timeout} s")
    for figures in runs:
        print(
            f"  load {figures['load']:.2f}: wall {figures['wall_s']} s "
            f"(+{figures['overrun_s']} s), Heron peak {figures['heron_peak_mb']} MB, kernel "
            f"peak {figures['kernel_peak_mb']} MB, result {figures['result_chars']} chars, "
            f"variables kept: {figures['variables_kept']}\n    last line: {figures['last_line']}"
        )


if __name__ == "__main__":
    main()
