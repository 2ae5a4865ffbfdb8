"""What one `grep` call costs now that its pattern is matched in a child process.

Two workspaces of Python-like text files: a small one (20 files) and a larger one (2,000 files
in 40 folders, about 8 MB). On each, rounds alternate the two ways of answering the same call:
  old  the files chosen and matched in Heron's process, on a thread (the tool before QA19k
       defect 2, reproduced here from heron/tools/files.py's own pieces);
  new  the tool as it is: files chosen on a thread, matched by heron/tools/grep_child.py.
Both must give the same text. Printed: the median and the spread of milliseconds per call, the
load average at the start; `--json` prints one JSON line.

    .venv/bin/python bench/grep.py [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from heron.tools import files
from heron.tools.context import ToolContext
from heron.tools.registry import in_thread

PATTERN = r"def \w+_7\("
LINE = "    value = compute(value, {n})  # a comment of ordinary length\n"


def make_workspace(root: Path, count: int) -> None:
    for n in range(count):
        folder = root / f"pkg{n % 40}"
        folder.mkdir(exist_ok=True)
        body = f"def name_{n % 10}(value):\n" + "".join(LINE.format(n=i) for i in range(60))
        (folder / f"mod{n}.py").write_text(body)


def old_grep(ctx: ToolContext, pattern: str) -> str:
    """The tool as it was: every file read and matched in this process."""
    chosen = files._grep_files(ctx, pattern, ".", None)
    regex = re.compile(pattern)
    root = ctx.workspace.resolve()
    matches: list[str] = []
    for named in chosen:
        found = files.workspace_io.read(root, named.inner, files.MAX_GREP_FILE)
        if not found.whole or b"\0" in found.data[:8192]:
            continue
        text = found.data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if regex.search(line):
                matches.append(f"{named.shown}:{number}:{files._clip(line, 300)}")
    return "\n".join(matches[: files.MAX_MATCHES])


async def timed(run: object) -> tuple[float, str]:
    start = time.perf_counter()
    out = await run  # type: ignore[misc]
    return (time.perf_counter() - start) * 1000, out


async def measure(ctx: ToolContext, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(rounds):
        old_ms, old_out = await timed(in_thread(old_grep, ctx, PATTERN))
        new_ms, new_out = await timed(files.grep(ctx, PATTERN))
        assert old_out == new_out, "old and new disagree"
        times["old"].append(old_ms)
        times["new"].append(new_ms)
    return times


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values), 1),
        "min_ms": round(min(values), 1),
        "max_ms": round(max(values), 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = float(Path("/proc/loadavg").read_text().split()[0])
    report: dict[str, object] = {"load": load, "rounds": args.rounds}
    with tempfile.TemporaryDirectory() as tmp:
        for label, count in (("small", 20), ("large", 2000)):
            root = Path(tmp, label)
            root.mkdir()
            make_workspace(root, count)
            times = await measure(ToolContext(workspace=root), args.rounds)
            report[label] = {"files": count, **{k: summary(v) for k, v in times.items()}}
    report["load_end"] = float(Path("/proc/loadavg").read_text().split()[0])
    if args.json:
        print(json.dumps(report))
        return
    print(f"load {load} -> {report['load_end']}, {args.rounds} rounds, old/new alternated")
    for label in ("small", "large"):
        part = report[label]
        assert isinstance(part, dict)
        for impl in ("old", "new"):
            s = part[impl]
            print(
                f"{label:5} {part['files']:5} files  {impl}: {s['median_ms']:8.1f} ms median"
                f"  ({s['min_ms']:.1f}-{s['max_ms']:.1f})"
            )


if __name__ == "__main__":
    os.nice(10)
    asyncio.run(main())
