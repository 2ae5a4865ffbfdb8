"""Which process of which host holds something (a lease, a held message): whether it still runs.

A process of this host that no longer exists (kill -9), a zombie included, holds nothing any
more; one of another host is never judged dead by this host (time alone never tells).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

HOST = socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs. A zombie does not: killed, it keeps its
    pid until its parent reaps it (a `heron serve` started by a script that has not waited
    for it yet), and a claim it held must not make the next turn wait for it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Linux's /proc says so (state Z, or X while it is being removed); elsewhere, no."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    # "pid (command) state ...": the command may hold spaces and parentheses; the last ")" ends it
    state = stat[stat.rfind(b")") + 1 :].split()[:1]
    return state in ([b"Z"], [b"X"])
