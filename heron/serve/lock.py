"""One `heron serve` per home: an fcntl lock on `$HERON_HOME/serve.lock`, its details in
`serve.json`.

The kernel releases an fcntl lock when its process dies, however it dies, so the files a
`kill -9` leaves behind never block the next start: the lock is free, and the new serve
overwrites serve.json and removes the stale socket. A clean exit removes serve.lock too,
while it still holds the lock; so a serve that opened the file just before it was removed
may then lock a file no longer in the folder, and `acquire` checks after locking that the
path still names the file it locked, else it opens it again (two serves never each hold "the"
lock). What other processes read of it (serve.json, whether the lock is held) is in
heron/store/home_lock.py, where the store asks it before migrating a database.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from heron import __version__
from heron.errors import ConfigError
from heron.store.home_lock import INFO_NAME, LOCK_NAME, ServeInfo, mark_holder, read_info

__all__ = ["INFO_NAME", "LOCK_NAME", "SOCKET_NAME", "ServeInfo", "ServeLock", "read_info"]

SOCKET_NAME = "serve.sock"
# A command about to migrate the database probes the lock for an instant (home_lock.py): a
# serve starting just then tries again for this long before it says another one runs.
PROBE_GRACE_S = 0.2


class ServeLock:
    """Held for the life of a serve; `acquire` refuses when another serve holds it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            fd = os.open(self.home / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
            if not _lock(fd):
                os.close(fd)
                raise self._refusal() from None
            if _same_file(fd, self.home / LOCK_NAME):
                break
            os.close(fd)  # locked a file the serve before us removed on its way out: again
        self._fd = fd
        mark_holder(fd)
        with contextlib.suppress(FileNotFoundError):  # a stale socket of a killed serve
            (self.home / SOCKET_NAME).unlink()

    def _refusal(self) -> ConfigError:
        info = read_info(self.home)
        who = f"pid {info.pid}, {info.url}" if info else "its details are not written yet"
        return ConfigError(
            f"heron serve already runs on {self.home} ({who})",
            hint="Use that one (heron run and heron chat talk to it), or stop it first "
            "(Ctrl-C in its terminal, or kill its pid).",
        )

    def publish(self, url: str, model: str = "") -> ServeInfo:
        """Write serve.json once the server listens (atomically: readers never see half), with
        when it started, its Heron's version and its `model` (`heron status` reads them)."""
        socket = str(self.home / SOCKET_NAME)
        info = ServeInfo(os.getpid(), url, socket, time.time(), __version__, model)
        tmp = self.home / f".{INFO_NAME}.{os.getpid()}"
        tmp.write_text(json.dumps(asdict(info)))
        tmp.replace(self.home / INFO_NAME)
        return info

    def release(self) -> None:
        """serve.json, the socket and serve.lock removed, the lock given up last (see the
        module docstring)."""
        if self._fd is None:
            return
        for name in (INFO_NAME, SOCKET_NAME, LOCK_NAME):
            with contextlib.suppress(FileNotFoundError):
                (self.home / name).unlink()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> ServeLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lock(fd: int) -> bool:
    """The exclusive lock, tried without waiting, again within PROBE_GRACE_S."""
    deadline = time.monotonic() + PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the open file `fd`."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
