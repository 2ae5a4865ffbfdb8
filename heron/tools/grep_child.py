"""The `grep` tool's matcher, run as a child process (`python -I grep_child.py WORKSPACE_IO`).

Python's `re` backtracks, and one `search` call holds the GIL until it returns: a pattern such
as `^(a+)+$` on a line of 40 `a`s takes hours, and in Heron's own process it would freeze the
event loop, every conversation, the web API and the answer to SIGTERM (QA19k). Here the pattern
runs in a process of its own that Heron kills when one file takes longer than its deadline or
when the turn is stopped (heron/tools/files.py's `grep`).

Standard library only, started with `-I` (no PYTHON* variables, no user site, not even this
file's folder on sys.path). Files are read through heron/workspace_io.py, loaded by its path
(given as the only argument): the same one-component-at-a-time, never-following-a-link,
never-blocking-on-a-FIFO reads Heron's own process makes.

stdin: one JSON object {"pattern", "root", "files" (paths relative to root), "max_bytes",
"max_matches", "clip", "alarm", "progress" (an inherited descriptor: the index of the file
being matched is written at its start)}. stdout, one JSON line each: "ready" once the pattern is
compiled, then for every file in order the list of its matches as [line number, the line's
first `clip` characters, the line's length]. It stops after `max_matches` + 1 matches in all.
"""

import importlib.util
import json
import os
import re
import signal
import sys
import time
from types import ModuleType

# Answers are sent at most this often: one write per file made a 2,000-file search 15% slower.
# Which file is being matched is written to the `progress` descriptor instead (a memfd Heron
# reads only when its deadline passes), so a stuck file is named right though answers wait.
FLUSH_SECONDS = 0.05


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("heron_workspace_io", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    return module


def _lines(io: ModuleType, root: str, name: str, max_bytes: int) -> list[str]:
    """The text lines of a regular file; none for one that is binary, too big or unreadable."""
    try:
        found = io.read(root, name, max_bytes)
    except (OSError, ValueError):
        return []  # unreadable, vanished, not a regular file: not worth failing the search
    if not found.whole or b"\0" in found.data[:8192]:
        return []
    lines: list[str] = found.data.decode("utf-8", errors="replace").splitlines()
    return lines


def main() -> None:
    io = _load(sys.argv[1])
    job = json.loads(sys.stdin.buffer.read())
    regex = re.compile(job["pattern"])
    out = sys.stdout
    out.write('"ready"\n')
    out.flush()
    left, clip = job["max_matches"] + 1, job["clip"]
    flush_at = time.monotonic() + FLUSH_SECONDS
    for index, name in enumerate(job["files"]):
        os.pwrite(job["progress"], index.to_bytes(4, "little"), 0)
        # Heron kills this process past the deadline; the alarm (no handler: its default action
        # ends the process) is for when Heron itself died first and cannot.
        signal.alarm(job["alarm"])
        found = []
        for number, line in enumerate(_lines(io, job["root"], name, job["max_bytes"]), 1):
            if regex.search(line):
                found.append([number, line[:clip], len(line)])
                left -= 1
                if not left:
                    break
        out.write(json.dumps(found) + "\n")
        if not left:
            return
        if time.monotonic() >= flush_at:  # Heron's clock restarts at each answer it reads
            out.flush()
            flush_at = time.monotonic() + FLUSH_SECONDS
    out.flush()


if __name__ == "__main__":
    main()
