"""Heron's own access to files a tool command can change: every read and write that Heron's
unconfined process makes inside the workspace goes through here.

Sandboxed commands write the workspace, so whatever is in it (a symlink, a FIFO, a folder
swapped for a link, a huge sparse file) is the agent's input to a process that runs with the
person's rights. A path is therefore opened one component at a time, relative to the
descriptor of the folder above it, with O_NOFOLLOW (folders with O_DIRECTORY too): no symlink
is followed below the root, dangling or not, and no `..` is taken, so nothing outside the root
is ever reached. Files are opened with O_NONBLOCK, so a FIFO answers at once, and anything but
a regular file is refused (`Refused`). New files are written under a temporary name made with
O_CREAT|O_EXCL|O_NOFOLLOW and then linked (`exclusive`) or renamed into place: a rename
replaces whatever link stood at the name instead of writing through it, and a reader never
sees half a file. Reads are bounded by the caller's limit.

The root itself (the workspace Heron was configured with, or the temp folder) is the person's
choice and is opened as given.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LINKED = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)  # what O_NOFOLLOW says of a link


class Refused(OSError):
    """A name inside the root that is not what Heron may open: a link, a FIFO, a folder where a
    file was expected, or a path that would leave the root."""


@dataclass(frozen=True)
class Read:
    data: bytes  # at most the limit asked for
    size: int  # the file's size when it was opened

    @property
    def whole(self) -> bool:
        return len(self.data) >= self.size


def parts_of(relative: str | PurePosixPath) -> tuple[list[str], str]:
    """The folders and the name of a path relative to the root; `..`, `.`-only and absolute
    paths are refused (they are never needed to name something inside)."""
    path = PurePosixPath(relative)
    names = [p for p in path.parts if p != "."]
    if path.is_absolute() or not names or ".." in names:
        raise Refused(errno.EPERM, f"{str(relative)!r} does not name a file inside the folder")
    return names[:-1], names[-1]


@contextlib.contextmanager
def folder(root: Path, names: list[str], create: bool = False) -> Iterator[int]:
    """A descriptor of the folder `root/names...`, every name opened without following a link
    (made when `create`); closed on leaving."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            fd = _step(fd, name, create)
        yield fd
    finally:
        os.close(fd)


def _step(fd: int, name: str, create: bool) -> int:
    """The folder `name` under `fd`, opened; `fd` is closed once the child is open."""
    try:
        try:
            child = os.open(name, _DIR, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=fd)
            child = os.open(name, _DIR, dir_fd=fd)
    except OSError as error:
        if error.errno in _LINKED:
            raise Refused(error.errno, f"{name} is a link or not a folder") from None
        raise
    os.close(fd)
    return child


def lstat(root: Path, relative: str | PurePosixPath) -> os.stat_result | None:
    """What stands at the name (a link is described, not followed); None when nothing does."""
    names, name = parts_of(relative)
    try:
        with folder(root, names) as fd:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, Refused):
        return None


def is_file(root: Path, relative: str | PurePosixPath) -> bool:
    found = lstat(root, relative)
    return found is not None and stat.S_ISREG(found.st_mode)


def open_regular(fd: int, name: str, flags: int, shown: str) -> tuple[int, os.stat_result]:
    """`name` under the folder `fd` opened with `flags` and never followed, blocked or taken
    unless it is a regular file: its descriptor and its status."""
    try:
        got = os.open(name, flags | _FILE, 0o666, dir_fd=fd)
    except OSError as error:
        if error.errno in _LINKED:
            raise Refused(error.errno, f"{shown} is a symbolic link") from None
        if error.errno == errno.ENXIO:  # a FIFO opened to write with no reader
            raise Refused(error.errno, f"{shown} is not a regular file") from None
        raise
    info = os.fstat(got)
    if not stat.S_ISREG(info.st_mode):
        os.close(got)
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise Refused(errno.EINVAL, f"{shown} is {kind}")
    return got, info


def read(root: Path, relative: str | PurePosixPath, limit: int) -> Read:
    """The first `limit` bytes of a regular file inside `root` and its size."""
    names, name = parts_of(relative)
    with folder(root, names) as dir_fd:
        fd, info = open_regular(dir_fd, name, os.O_RDONLY, str(relative))
    with os.fdopen(fd, "rb") as f:
        return Read(f.read(limit), info.st_size)


def write(
    root: Path, relative: str | PurePosixPath, data: bytes, *, exclusive: bool = False
) -> bool:
    """Put `data` at `relative` inside `root`, folders made as needed. `exclusive`: only where
    nothing stands at the name (a dangling link counts), else False. Otherwise what stands
    there is replaced, a link or FIFO included, never written through (a folder is refused)."""
    names, name = parts_of(relative)
    with folder(root, names, create=True) as dir_fd:
        temp = f".{name[:40]}.{secrets.token_hex(6)}.tmp"
        fd, _ = open_regular(dir_fd, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, temp)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if exclusive:
                try:
                    os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                except FileExistsError:
                    return False
            else:
                os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=dir_fd)
    return True


def overwrite(root: Path, relative: str | PurePosixPath, data: bytes) -> None:
    """Write `data` into the regular file at `relative` in place (its other hard links, which
    the caller has checked, see the change), or create it; anything else there is refused."""
    names, name = parts_of(relative)
    with folder(root, names, create=True) as dir_fd:
        fd, _ = open_regular(dir_fd, name, os.O_WRONLY | os.O_CREAT, str(relative))
    with os.fdopen(fd, "wb") as f:
        os.ftruncate(f.fileno(), 0)
        f.write(data)


def append_to(root: Path, relative: str | PurePosixPath) -> int:
    """A descriptor to append to the file at `relative`, a file of its own: a link, FIFO or
    file with another name (a hard link) standing there is removed and a new file made."""
    names, name = parts_of(relative)
    with folder(root, names, create=True) as dir_fd:
        for _ in range(2):
            try:
                fd, info = open_regular(
                    dir_fd, name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, str(relative)
                )
            except Refused:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dir_fd)
                continue
            if info.st_nlink == 1:
                return fd
            os.close(fd)
            os.unlink(name, dir_fd=dir_fd)
        raise Refused(errno.EEXIST, f"{relative} keeps being replaced")
