"""Acts only the person may do: accepting, rejecting and forgetting memory, deleting a
conversation. The CLI refuses them when it runs under a Heron tool command.

Sandboxed, such a command cannot reach them anyway: HERON_HOME is hidden. Unconfined, the CLI
walks its chain of parent processes (/proc/PID/status PPid) and reads each one's argv
(/proc/PID/cmdline) for the mark heron/tools/sandbox.py leaves on the process that starts every
tool command (bwrap, or heron/tools/runner.py). That process belongs to Heron, not to the
command: an environment variable, by contrast, is the command's to unset. A process the command
detaches (setsid and a double fork) is reparented to bwrap's pid 1 or to the runner, a child
subreaper, so it stays in the chain.
"""

from __future__ import annotations

import os
from pathlib import Path

from heron.errors import HeronError
from heron.tools.sandbox import is_marker

PROC = Path("/proc")
MAX_DEPTH = 256  # a chain longer than this is a loop in what /proc said


class PersonOnly(HeronError):
    """A person-only act was asked for by a tool command."""


def tool_ancestor(start: int | None = None, proc: Path = PROC) -> int | None:
    """The pid of the nearest ancestor of `start` (default: this process) that carries the
    tool runner's mark, or None. Pids are those of the /proc this process sees (inside the
    sandbox, its own pid namespace, whose pid 1 is bwrap)."""
    pid = _parent(start if start is not None else os.getpid(), proc)
    for _ in range(MAX_DEPTH):
        if pid is None or pid <= 0:
            return None
        if any(is_marker(arg) for arg in _argv(pid, proc)):
            return pid
        pid = _parent(pid, proc)
    return None


def _argv(pid: int, proc: Path) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _parent(pid: int, proc: Path) -> int | None:
    try:
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return None


def ensure_person(act: str) -> None:
    """Raise PersonOnly when this process was started, at any depth, by a Heron tool."""
    runner = tool_ancestor()
    if runner is not None:
        raise PersonOnly(
            f"refused: {act} is the person's act; run it in your own terminal",
            hint=f"This command was started by one of Heron's tools (process {runner}), so "
            "it may be the agent asking. Only you can do this, outside the agent.",
        )
