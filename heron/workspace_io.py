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
sees half a file (`replace`, the file tools' write, keeps the file's mode and says where it
must write in place instead). Reads are bounded by the caller's limit.

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
    with folder(root, names, create=True) as dir_fd, _staged(dir_fd, name, data) as temp:
        if not exclusive:
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return True
        try:
            os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            return False
    return True


class PartlyWritten(OSError):
    """A write made in place (`replace`'s fallback) that failed midway: the file may hold part
    of the new content."""


def replace(root: Path, relative: str | PurePosixPath, data: bytes) -> None:
    """Put `data` in place of the regular file at `relative` (made, with its folders, when
    absent) so that a reader sees the old or the new content whole: written under a temporary
    name in the same folder, flushed to disk, renamed over it, with the file's mode.

    In place instead (truncated, then written; a reader may see it part-written) where a rename
    would change more than the content: the file has other names (hard links, which the caller
    has checked lie inside: a rename would part them), belongs to another user (it would become
    ours), or the folder takes no new file (its permissions, a file bind-mounted alone). A file
    this process may not write is refused (PermissionError), as is anything but a regular file.
    """
    names, name = parts_of(relative)
    with folder(root, names, create=True) as dir_fd:
        try:
            fd, info = open_regular(dir_fd, name, os.O_WRONLY, str(relative))
        except FileNotFoundError:
            _swap(dir_fd, name, data, None)
            return
        try:
            if info.st_nlink == 1 and info.st_uid == os.geteuid():
                try:
                    _swap(dir_fd, name, data, stat.S_IMODE(info.st_mode))
                    return
                except PermissionError:
                    pass  # no temporary may be made or renamed here: in place, below
            _in_place(fd, data)
        finally:
            os.close(fd)


def _swap(dir_fd: int, name: str, data: bytes, mode: int | None) -> None:
    """`data` on disk under a temporary name, then renamed over `name` (atomic)."""
    with _staged(dir_fd, name, data, mode=mode, sync=True) as temp:
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _in_place(fd: int, data: bytes) -> None:
    try:
        os.ftruncate(fd, 0)
        _write_all(fd, data)
    except OSError as error:
        raise PartlyWritten(error.errno, f"{error.strerror}, midway through") from error


@contextlib.contextmanager
def _staged(
    dir_fd: int, name: str, data: bytes, *, mode: int | None = None, sync: bool = False
) -> Iterator[str]:
    """The name of a new file beside `name` holding `data` (O_EXCL, never a link followed),
    with `mode` when given and flushed to disk when `sync`; removed on leaving unless the
    caller renamed it into place."""
    temp = f".{name[:40]}.{secrets.token_hex(6)}.tmp"
    fd, _ = open_regular(dir_fd, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, temp)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            _write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        yield temp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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
