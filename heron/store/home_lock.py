"""Whether a `heron serve` holds a home, as any other process can tell: the fcntl lock on
`$HERON_HOME/serve.lock` (taken by heron/serve/lock.py) and its details in `serve.json`.

Here, below the serve, because the store asks it: a Heron that would migrate a home's
database refuses to while a serve runs on that home (the serve, perhaps an older Heron, would
go on writing rows of the schema it knows into one it does not). The serve's own process is
not "another": it migrates as it starts, under its own lock, and it wrote its pid into the lock
file as it took it (`mark_holder`), which is how it knows the lock is its own. stdlib only.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = "serve.lock"
INFO_NAME = "serve.json"


@dataclass(frozen=True)
class ServeInfo:
    """What a running serve tells other processes about itself. `started` (epoch seconds),
    `version` (its Heron's) and `model` (`provider/model`) are what `heron status` shows; a
    serve of an earlier Heron wrote none of them (0.0 and "")."""

    pid: int
    url: str
    socket: str
    started: float = 0.0
    version: str = ""
    model: str = ""


def read_info(home: Path) -> ServeInfo | None:
    """The running serve's details, or None when there are none (or they are unreadable)."""
    try:
        data = json.loads((home / INFO_NAME).read_text())
        started = float(data.get("started") or 0.0)
        version, model = str(data.get("version") or ""), str(data.get("model") or "")
        return ServeInfo(
            int(data["pid"]), str(data["url"]), str(data["socket"]), started, version, model
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def mark_holder(fd: int) -> None:
    """Write this process's pid into the lock file it just locked (open as `fd`)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


def _holder(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0))
    except (OSError, ValueError):  # not written yet, or an older serve's empty file
        return None


def other_serve(home: Path) -> str | None:
    """ "pid N, URL" of a serve another process runs on `home` ("starting": its details are
    not written yet); None when none holds the lock."""
    holder = serve_holder(home)
    if holder is None or holder == os.getpid():  # this process is the serve: it may migrate
        return None
    info = read_info(home)
    return f"pid {info.pid}, {info.url}" if info else "starting"


def serve_holder(home: Path) -> int | None:
    """Whether a serve holds `home`'s lock, this process's own included: the pid it wrote into
    the lock file (0 while it has not yet), or None when none holds it. A shared lock tried
    without waiting and let go at once: a serve starting in that instant retries
    (heron/serve/lock.py)."""
    try:
        fd = os.open(home / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no lock file: no serve (a clean exit removes it)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder(fd) or 0
    finally:
        os.close(fd)  # closing lets go of the shared lock, if it was taken
    return None
