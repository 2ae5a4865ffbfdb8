"""One lock per workspace file, held by the file tools around a change (edit_file's read,
change and write back; write_file), shared by every turn of a home in every process.

The workspace is shared: two conversations, a subagent, a goal, a scheduled job and the
person's chat all work in it, in one `heron serve` or in a `heron run` or worker beside it. A
lock per turn let two edits of one file read the same text and each write back its own change,
the second losing the first's although both were told "Replaced".

The lock is an `flock` on a file under HERON_HOME/run/locks/, which every process of the home
reaches and no command the agent runs sees (the sandbox covers HERON_HOME with an empty tmpfs,
docs/security.md), so a command cannot hold it. An flock belongs to the open file, so it also
holds between threads of one process, which open the file each for itself; a thread lock per
stripe is taken first, so threads of one process wait on it rather than polling. Files map onto
STRIPES lock files by a digest of the file's resolved path (a fixed set: none is ever removed,
which would race with a process about to lock it); two files sharing a stripe only wait for each
other's writes, which take milliseconds. A file with several names (hard links, all inside the
workspace as heron/tools/files.py checks) is keyed by its inode, which an in-place write keeps.

Without a home (a bare ToolContext, a replay in a temporary copy) only the thread lock is held:
nothing else shares that folder. Two homes whose workspaces are one folder (a symlink between
them) do not see each other's locks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

STRIPES = 256
LOCKS_DIR = Path("run") / "locks"  # under HERON_HOME
# How long a change waits for another one of the same file (or stripe) before giving up: a
# write takes milliseconds; a process stopped (SIGSTOP) while holding the lock should not hang
# every later edit for ever.
WAIT_SECONDS = 60.0
_THREADS = [threading.Lock() for _ in range(STRIPES)]


class Busy(Exception):
    """The lock was not free within WAIT_SECONDS."""


@contextlib.contextmanager
def held(home: Path | None, path: Path) -> Iterator[None]:
    """The lock of the file at `path` (resolved), for every thread and process of `home`."""
    stripe = _stripe(path)
    deadline = time.monotonic() + WAIT_SECONDS
    if not _THREADS[stripe].acquire(timeout=WAIT_SECONDS):
        raise Busy(path)
    try:
        if home is None:
            yield
            return
        fd = _open(home, stripe)
        try:
            _flock(fd, deadline, path)
            yield
        finally:
            os.close(fd)  # releases the flock
    finally:
        _THREADS[stripe].release()


def _stripe(path: Path) -> int:
    try:
        found = os.stat(path, follow_symlinks=False)
    except OSError:
        found = None
    if found is not None and stat.S_ISREG(found.st_mode) and found.st_nlink > 1:
        key = f"inode {found.st_dev}:{found.st_ino}"
    else:
        key = f"path {path}"
    digest = hashlib.blake2b(os.fsencode(key), digest_size=8).digest()
    return int.from_bytes(digest, "big") % STRIPES


def _open(home: Path, stripe: int) -> int:
    folder = home / LOCKS_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(folder / f"file-{stripe:03d}.lock", flags, 0o600)


def _flock(fd: int, deadline: float, path: Path) -> None:
    """Take the flock, polling (a blocking flock cannot time out) until `deadline`."""
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            raise Busy(path)
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
