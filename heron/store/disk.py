"""A write the disk refused, told apart from a damaged database.

SQLite says "database or disk is full" (SQLITE_FULL), "disk I/O error" (SQLITE_IOERR: a full disk
when the -shm file cannot grow), "attempt to write a readonly database" (SQLITE_READONLY) or
"unable to open database file" (SQLITE_CANTOPEN: a read-only folder where the -wal and -shm
files cannot be made). None of these means the file is damaged, and the advice for damage (move
the file aside) would cost the person their history: each is turned here into the error that
says what is wrong with the disk and what to do (`DiskFull`, `ReadOnlyHome`). Only SQLITE_CORRUPT
and SQLITE_NOTADB are damage (`damaged`).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from heron.errors import DiskFull, ReadOnlyHome
from heron.messages import size_label

# Primary result codes (https://sqlite.org/rescode.html); an extended code keeps its primary
# code in its low byte (SQLITE_IOERR_SHMSIZE is 4874 = 19 << 8 | 10).
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
SQLITE_NOTADB = 26
# An I/O error with less than this free on the database's disk is taken for a full disk: SQLite
# grows the -shm file 32 KB at a time and the WAL a page (4 KB) at a time.
NEARLY_FULL = 1 << 20

READ_ONLY_HINT = (
    "Make it writable (remount the disk read-write, or give the folder and the file write "
    "permission), or copy the home to a writable place and set HERON_HOME to the copy. "
    "Nothing in it is damaged: `heron conversations list/show/search/export` and "
    "`heron memory recall` still read it."
)
FULL_HINT = "Free space on that disk, then try again; what was saved before is kept."


def primary_code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def refusal(error: BaseException, path: Path) -> DiskFull | ReadOnlyHome | None:
    """The disk's refusal `error` stands for (a full disk, a read-only file or folder), for
    the database at `path`; None for anything else (damage, a bug, a busy lock)."""
    if not isinstance(error, sqlite3.Error) or str(path) == ":memory:":
        return None
    code = primary_code(error)
    if code is None:  # an error raised by hand (tests) or an older sqlite3: its words
        code = _code_of_words(str(error))
    if code == SQLITE_FULL or (code == SQLITE_IOERR and free_bytes(path) < NEARLY_FULL):
        return disk_full(path)
    if code == SQLITE_READONLY or (code in (SQLITE_CANTOPEN, SQLITE_IOERR) and read_only(path)):
        return read_only_home(path)
    return None


def locked(error: sqlite3.Error) -> bool:
    """Whether `error` says another connection holds the database locked (SQLITE_BUSY or
    SQLITE_LOCKED), past the busy timeout."""
    code = primary_code(error)
    if code is None:
        return "database is locked" in str(error) or "database table is locked" in str(error)
    return code in (SQLITE_BUSY, SQLITE_LOCKED)


def damaged(error: BaseException) -> bool:
    """Whether `error` says the file itself is not a sound database."""
    if not isinstance(error, sqlite3.Error):
        return False
    code = primary_code(error)
    if code is None:
        words = str(error)
        return "malformed" in words or "not a database" in words
    return code in (SQLITE_CORRUPT, SQLITE_NOTADB)


def disk_full(path: Path) -> DiskFull:
    free = free_bytes(path)
    return DiskFull(
        f"the disk holding {path.parent} is full ({size_label(free)} free): Heron cannot write "
        f"to its database {path.name}",
        hint=FULL_HINT,
    )


def read_only_home(path: Path) -> ReadOnlyHome:
    where = path.parent if not os.access(path.parent, os.W_OK) else path
    return ReadOnlyHome(
        f"{where} is read-only: Heron cannot write to its database", hint=READ_ONLY_HINT
    )


def free_bytes(path: Path) -> int:
    """What an unprivileged writer may still use on the disk holding `path`; a large number
    when it cannot be told (the error is then not taken for a full disk)."""
    try:
        found = os.statvfs(path.parent)
    except OSError:
        return 1 << 62
    return found.f_bavail * found.f_frsize


def read_only(path: Path) -> bool:
    """Whether the database at `path`, or its folder (where SQLite makes the -wal and -shm
    files), refuses writing: a read-only mount, or permissions."""
    folder = path.parent
    if _mounted_read_only(folder) or not os.access(folder, os.W_OK):
        return True
    return path.exists() and not os.access(path, os.W_OK)


def _mounted_read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _code_of_words(words: str) -> int | None:
    if "disk is full" in words:
        return SQLITE_FULL
    if "readonly database" in words:
        return SQLITE_READONLY
    if "disk I/O error" in words:
        return SQLITE_IOERR
    if "unable to open database file" in words:
        return SQLITE_CANTOPEN
    return None
