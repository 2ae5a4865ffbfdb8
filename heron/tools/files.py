"""File tools, confined to the workspace.

Every path goes through `resolve_in`, the single place that decides what is inside: it resolves
symlinks first, so `..`, an absolute path and a symlink pointing out are all refused alike. A
hard link has no "real" path to resolve: a regular file with more than one link is refused
unless every one of its links is found inside the workspace (the same device and inode under
another name there), so a link to a file outside (config.toml, a key) is neither read nor
written through.

The resolved path is then opened through heron/workspace_io.py, one component at a time and
never following a link: a path a concurrent command swaps for a link after the check is
refused, not followed; a FIFO or socket is refused at once instead of blocking a thread; a
read takes at most MAX_READ bytes (the binary test looks at the first 8 KiB), so a huge
sparse file costs nothing.

`grep`'s pattern is the model's and `re` backtracks: one `search` can run for hours holding the
GIL, which no thread or timer of Heron's process can interrupt. The files are chosen here; the
matching runs in heron/tools/grep_child.py, a process of its own killed when one file passes
GREP_FILE_SECONDS or the turn is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import shlex
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from heron import file_locks, workspace_io
from heron.errors import PathEscape, ToolError
from heron.tools import grep_child
from heron.tools.context import ToolContext
from heron.tools.registry import in_thread, tool

MAX_LINE = 2000  # characters of one line shown by read_file (minified files have huge lines)
MAX_LIST = 500
MAX_MATCHES = 200
MAX_MATCH_LINE = 300
MAX_GREP_FILE = 5_000_000  # bytes; bigger files are data, not source
FOOTER_ROOM = 200  # characters of the result budget kept for read_file's footer
MAX_READ = 10_000_000  # bytes read_file and edit_file read of one file (a sparse file claims more)
SKIP_DIRS = frozenset({".git", ".heron"})
NAME_MAX = 255  # bytes of one file name (Linux's NAME_MAX)
MAX_LINK_SCAN = 50_000  # names looked at to find a hard link's other names; past it, refuse
GREP_FILE_SECONDS = 10.0  # one file's matching; past it the pattern backtracks catastrophically
GREP_START_SECONDS = 60.0  # the matcher's interpreter starting, on a loaded machine
# Isolated (-I): no PYTHON* variables, no user site, not its own folder on sys.path.
_GREP_CHILD = (
    sys.executable,
    "-I",
    str(Path(__file__).with_name("grep_child.py")),
    workspace_io.__file__,
)


def resolve_in(workspace: Path, path: str | Path) -> Path:
    """`path` (relative to the workspace, or absolute) resolved, symlinks included; raises
    PathEscape if the result lies outside the workspace."""
    root = workspace.resolve()
    shown = _shown(path)
    _refuse_controls(str(path), shown)
    try:
        candidate = Path(path).expanduser()
        resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
        if any(len(os.fsencode(part)) > NAME_MAX for part in resolved.parts):
            raise OSError(errno.ENAMETOOLONG, "a name in it is too long")
    except (RuntimeError, ValueError, OSError) as e:  # a link loop, a NUL, a name too long
        raise PathEscape(
            f"{shown} cannot be used as a path: {_why(e)}",
            hint="Use a plain path inside the workspace.",
        ) from None
    if resolved != root and not resolved.is_relative_to(root):
        raise PathEscape(
            f"{str(path)!r} is outside the workspace {root}",
            hint="Use a path inside the workspace; relative paths start there.",
        )
    _check_links(resolved, root, path)
    return resolved


# C0 controls (newline and tab included), DEL and the C1 controls. A name holding one is shown
# as it is in results and listings the model reads, where a newline in it forges a line
# ("x\n[exit code 0]") and an escape sequence reaches a terminal: no file tool takes one.
_CONTROL = re.compile(r"[\x01-\x1f\x7f-\x9f]")  # NUL: said by resolve_in itself


def _refuse_controls(path: str, shown: str) -> None:
    found = _CONTROL.search(path)
    if found is None:
        return
    raise PathEscape(
        f"{shown} holds a control character ({found.group()!r}): a file name with one could "
        "pass for other lines of a result",
        hint="Use a name of printable characters (no newline, tab or escape).",
    )


def _shown(path: str | Path) -> str:
    """A path as an error repeats it: quoted, and cut when long (a 6,000-character name
    filled the answer)."""
    text = str(path)
    return repr(text if len(text) <= 200 else text[:200] + "…")


def _why(error: Exception) -> str:
    if isinstance(error, RuntimeError):
        return "its links lead in a loop"
    if isinstance(error, ValueError):
        return "it holds a NUL character"
    return (error.strerror or str(error)).lower() if isinstance(error, OSError) else str(error)


def _check_links(path: Path, root: Path, shown: str | Path) -> None:
    """Refuse a regular file with a hard link outside the workspace."""
    try:
        st = path.stat()
    except OSError:
        return  # not there (yet): nothing to be linked
    if not stat.S_ISREG(st.st_mode) or st.st_nlink <= 1:
        return
    inside = _names_inside(root, st.st_dev, st.st_ino, st.st_nlink)
    if inside < st.st_nlink:
        raise PathEscape(
            f"{str(shown)!r} is a hard link to a file outside the workspace ({st.st_nlink} "
            f"links, {inside} of them inside)",
            hint="Files outside the workspace are not for the file tools; ask the person to "
            "copy the file in if it is meant to be worked on.",
        )


def _names_inside(root: Path, dev: int, ino: int, wanted: int) -> int:
    """How many names under `root` are the file (dev, ino); stops at `wanted`, and gives up
    (0: refuse) past MAX_LINK_SCAN names."""
    found = seen = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            seen += 1
            if seen > MAX_LINK_SCAN:
                return 0
            try:
                st = os.stat(os.path.join(folder, name), follow_symlinks=False)
            except OSError:
                continue
            if st.st_ino == ino and st.st_dev == dev:
                found += 1
                if found >= wanted:
                    return found
    return found


def _linked_out(path: Path, root: Path) -> bool:
    try:
        _check_links(path, root, path)
    except PathEscape:
        return True
    return False


def _rel(ctx: ToolContext, path: Path) -> str:
    return path.relative_to(ctx.workspace.resolve()).as_posix() or "."


def _inner(root: Path, path: Path) -> str:
    """`path` (resolved, inside `root`) as workspace_io takes it: relative, "/"-separated."""
    return path.relative_to(root).as_posix()


def _read(root: Path, path: Path, shown: str, limit: int = MAX_READ) -> workspace_io.Read:
    """The first `limit` bytes of the regular file at `path`, opened through workspace_io: a
    link swapped in since `resolve_in` is refused, a FIFO or socket answers at once."""
    if path == root or path.is_dir():
        raise ToolError(f"{shown} is a folder; use list_files to see what it holds")
    try:
        return workspace_io.read(root, _inner(root, path), limit)
    except FileNotFoundError:
        raise ToolError(f"no such file: {shown}") from None
    except workspace_io.Refused as refused:
        raise ToolError(
            f"{refused.strerror}; the file tools read and write regular files only",
            hint="Use bash to look at what it is (ls -l).",
        ) from None
    except OSError as error:
        raise ToolError(f"cannot read {shown}: {error.strerror or error}") from None


def _read_text(root: Path, path: Path, shown: str) -> tuple[str, workspace_io.Read]:
    found = _read(root, path, shown)
    if b"\0" in found.data[:8192]:
        raise ToolError(
            f"{shown} is a binary file ({found.size} bytes); use run_cell to inspect it"
        )
    # newline="" semantics: keep \r\n as it is so an edit does not rewrite every line ending.
    return found.data.decode("utf-8", errors="replace"), found


def _write(root: Path, path: Path, shown: str, text: str) -> None:
    """`text` into the regular file at `path` (made, with its folders, when absent), opened
    through workspace_io: never through a link, never blocked on a FIFO, and swapped in whole
    (`workspace_io.replace`), so a concurrent reader sees the old or the new file."""
    if path == root or path.is_dir():
        raise ToolError(f"{shown} is a folder")
    try:
        workspace_io.replace(root, _inner(root, path), text.encode("utf-8"))
    except workspace_io.Refused as refused:
        raise ToolError(
            f"{refused.strerror}; the file tools read and write regular files only",
            hint="Use bash to look at what it is (ls -l).",
        ) from None
    except workspace_io.PartlyWritten as error:
        raise ToolError(
            f"cannot write {shown}: {error.strerror}; it was being written in place (it has "
            "other names, or its folder takes no new file) and may now be cut",
            hint="Read it to see what it holds, then write it again.",
        ) from None
    except OSError as error:
        raise ToolError(
            f"cannot write {shown}: {error.strerror or error}; nothing was changed"
        ) from None


@contextlib.contextmanager
def _changing(ctx: ToolContext, path: Path, shown: str) -> Iterator[None]:
    """The file's lock for a change, shared by every turn of the home in every process
    (heron/file_locks.py): a concurrent edit of the same file waits, then reads what this
    one wrote, instead of both writing back their own copy."""
    try:
        with file_locks.held(ctx.services.home, path):
            yield
    except file_locks.Busy:
        raise ToolError(
            f"another call is changing {shown} and has held it for over "
            f"{file_locks.WAIT_SECONDS:g} s; nothing was changed",
            hint="Try again; read the file first, it may have changed.",
        ) from None


@tool
def read_file(ctx: ToolContext, path: str, offset: int = 1, limit: int = 2000) -> str:
    """Read a text file; lines come numbered.

    Args:
        offset: First line to read (1-based).
        limit: Maximum number of lines.
    """
    target = resolve_in(ctx.workspace, path)
    text, found = _read_text(ctx.workspace.resolve(), target, path)
    lines = text.splitlines()
    if not found.whole and len(lines) > 1:  # the last line read may be cut: not shown
        lines = lines[:-1]
    if not lines:
        return f"{path} is empty."
    start = max(offset, 1)
    if start > len(lines) and not found.whole:
        raise ToolError(
            f"offset {offset} is past the {len(lines):,} lines read_file reads of {path}: it "
            f"reads the first {MAX_READ:,} of its {found.size:,} bytes, and the file goes on. "
            f"Use bash for what follows: {_sed(path, offset)}"
        )
    if start > len(lines):
        raise ToolError(f"offset {offset} is past the end of {path} ({len(lines)} lines)")
    chunk = lines[start - 1 : start - 1 + max(limit, 1)]
    width = len(str(start + len(chunk) - 1))
    numbered = _within(
        [f"{n:>{width}}\t{_clip(line, MAX_LINE)}" for n, line in enumerate(chunk, start)],
        ctx.result_budget - FOOTER_ROOM,
    )
    body = "\n".join(numbered)
    end = start + len(numbered) - 1
    return body + _footer(path, start, end, len(lines), found)


def _footer(path: str, start: int, end: int, count: int, found: workspace_io.Read) -> str:
    """Where the page ends and how to read on; a file longer than MAX_READ goes on past the
    `count` lines read, which is never called its end."""
    if found.whole and end == count:
        return ""
    if found.whole:
        return f"\n[lines {start}-{end} of {count}; read on with offset={end + 1}]"
    read = f"read_file reads the first {MAX_READ:,} of its {found.size:,} bytes"
    if end < count:
        return (
            f"\n[lines {start}-{end} of the first {count:,} ({read}, and the file goes on); "
            f"read on with offset={end + 1}]"
        )
    return (
        f"\n[line {end} is the last one read of {path}: {read}, and the file goes on. Use bash "
        f"for what follows: {_sed(path, end + 1)}]"
    )


def _sed(path: str, line: int) -> str:
    """The bash command that prints a page of `path` from `line` on."""
    return f"sed -n '{line},+1999p' {shlex.quote(path)}"


def _within(lines: list[str], budget: int) -> list[str]:
    """The first of `lines` that fit `budget` characters (one at least): a page the model
    reads whole, its footer saying where the next starts, rather than one cut in its middle."""
    size = 0
    for count, line in enumerate(lines):
        size += len(line) + 1
        if size > budget and count:
            return lines[:count]
    return lines


def _clip(line: str, limit: int, length: int | None = None) -> str:
    """`line` cut to `limit` characters; `length`: the whole line's, when `line` is its head."""
    length = len(line) if length is None else length
    return line if length <= limit else f"{line[:limit]}[... {length - limit} more]"


@tool(writes=True)
def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Create or overwrite a file (parent folders are created)."""
    target = resolve_in(ctx.workspace, path)
    with _changing(ctx, target, path):
        _write(ctx.workspace.resolve(), target, path, content)
    ctx.record_effect({"kind": "file_written", "path": _rel(ctx, target)})
    return f"Wrote {len(content)} characters to {_rel(ctx, target)}."


@tool(writes=True)
def edit_file(ctx: ToolContext, path: str, old: str, new: str, replace_all: bool = False) -> str:
    """Replace exact text in a file. `old` must match exactly, whitespace included, and occur
    once unless replace_all is true."""
    target = resolve_in(ctx.workspace, path)
    with _changing(ctx, target, path):
        count = _replace_in(ctx.workspace.resolve(), target, path, (old, new), replace_all)
    ctx.record_effect({"kind": "file_written", "path": _rel(ctx, target)})
    return f"Replaced {count} occurrence{'s' if count > 1 else ''} in {_rel(ctx, target)}."


def _replace_in(
    root: Path, target: Path, path: str, change: tuple[str, str], replace_all: bool
) -> int:
    """edit_file's read, change and write back (under the file's lock): how many were replaced.
    An `old` the file no longer holds (another turn changed it since the model read it) is
    not found: exact matching is what keeps a stale edit out."""
    old, new = change
    text, found = _read_text(root, target, path)
    if not found.whole:
        raise ToolError(
            f"{path} is {found.size:,} bytes, too large to edit here (at most {MAX_READ:,})",
            hint="Edit it with bash (sed -i) or run_cell.",
        )
    if not old:
        raise ToolError("old is empty; to create or overwrite a file use write_file")
    if old not in text and "\r\n" in text and "\r\n" not in old:
        # The model writes \n; a file with Windows line endings should still match.
        old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
    count = text.count(old)
    if count == 0:
        raise ToolError(
            f"old text not found in {path}; read the file and copy the exact text, "
            "whitespace and indentation included"
        )
    if count > 1 and not replace_all:
        raise ToolError(
            f"old text occurs {count} times in {path}; include more surrounding lines "
            "to make it unique, or set replace_all to true"
        )
    _write(root, target, path, text.replace(old, new))
    return count


def _check_pattern(pattern: str) -> None:
    parts = PurePosixPath(pattern).parts
    if PurePosixPath(pattern).is_absolute() or ".." in parts:
        raise PathEscape(
            f"pattern {pattern!r} reaches outside the folder",
            hint="Give the folder as path and a relative pattern such as '**/*.py'.",
        )


@tool
def list_files(ctx: ToolContext, path: str = ".", pattern: str = "*") -> str:
    """List files and folders (folders end with /).

    Args:
        pattern: Glob; '**/*.py' searches subfolders.
    """
    base = resolve_in(ctx.workspace, path)
    if not base.is_dir():
        raise ToolError(f"{path} is not a folder")
    _check_pattern(pattern)
    root = ctx.workspace.resolve()
    entries: list[str] = []
    for entry in sorted(base.glob(pattern)):
        rel_to_base = entry.relative_to(base).parts
        if SKIP_DIRS.intersection(rel_to_base[:-1]) or not _inside(entry, root):
            continue
        entries.append(_rel(ctx, entry) + ("/" if entry.is_dir() else ""))
    if not entries:
        return f"Nothing in {path} matches {pattern!r}."
    shown = "\n".join(entries[:MAX_LIST])
    if len(entries) > MAX_LIST:
        shown += f"\n[{len(entries) - MAX_LIST} more; narrow the pattern or the folder]"
    return shown


def _inside(path: Path, root: Path) -> bool:
    resolved = path.resolve()
    return resolved == root or resolved.is_relative_to(root)


def _files_under(base: Path, root: Path, glob: str | None) -> Iterator[Path]:
    """Regular files under `base` in a stable order, skipping .git/.heron and symlinks out."""
    if base.is_file():
        yield base
        return
    for folder, dirs, names in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(names):
            path = Path(folder, name)
            if glob and not _glob_match(path.relative_to(base).as_posix(), glob):
                continue
            if path.is_symlink() and not _inside(path, root):
                continue
            if _linked_out(path, root):
                continue
            yield path


def _glob_match(rel: str, glob: str) -> bool:
    # PurePath.match reads '**' as one folder; '**/*.py' must also match a top-level file.
    path = PurePosixPath(rel)
    return path.match(glob) or (glob.startswith("**/") and path.match(glob[3:]))


@tool
async def grep(ctx: ToolContext, pattern: str, path: str = ".", glob: str | None = None) -> str:
    """Search files for a Python regular expression (10 s a file at most); returns
    path:line:text.

    Args:
        path: File or folder to search.
        glob: Only files matching this glob, e.g. '*.py'.
    """
    files = await in_thread(_grep_files, ctx, pattern, path, glob)
    matches: list[str] = []
    for shown, found in await _search(ctx.workspace.resolve(), pattern, files):
        for number, head, length in found:
            if len(matches) == MAX_MATCHES:
                more = f"[stopped at {MAX_MATCHES} matches; narrow the search]"
                return "\n".join([*matches, more])
            matches.append(f"{shown}:{number}:{_clip(head, MAX_MATCH_LINE, length)}")
    return "\n".join(matches) if matches else f"No matches for {pattern!r}."


def _grep_files(ctx: ToolContext, pattern: str, path: str, glob: str | None) -> list[_Named]:
    """The files `grep` searches, each as workspace_io names it and as the result shows it;
    the pattern checked first (compiling is quick: only matching can backtrack)."""
    base = resolve_in(ctx.workspace, path)
    if not base.exists():
        raise ToolError(f"no such file or folder: {path}")
    try:
        re.compile(pattern)
    except re.error as error:
        raise ToolError(f"invalid regular expression {pattern!r}: {error}") from None
    root = ctx.workspace.resolve()
    return [
        _Named(_inner(root, file.resolve()), _rel(ctx, file))
        for file in _files_under(base, root, glob)
    ]


@dataclass(frozen=True)
class _Named:
    inner: str  # relative to the resolved workspace, links resolved: what the child opens
    shown: str  # as the result names it


async def _search(root: Path, pattern: str, files: list[_Named]) -> list[tuple[str, list[Any]]]:
    """Each file's matches ([line number, the line's first MAX_MATCH_LINE characters, its
    length]), found by heron/tools/grep_child.py in a process of its own: a pattern that
    backtracks for hours holds that process's GIL, not Heron's, and the process is killed when
    one file passes GREP_FILE_SECONDS or when the turn is stopped (this task cancelled)."""
    progress = os.memfd_create("heron-grep-progress", os.MFD_CLOEXEC)
    try:
        return await _run_child(root, pattern, files, progress)
    finally:
        os.close(progress)


async def _run_child(
    root: Path, pattern: str, files: list[_Named], progress: int
) -> list[tuple[str, list[Any]]]:
    job = {
        "progress": progress,
        "pattern": pattern,
        "root": str(root),
        "files": [named.inner for named in files],
        "max_bytes": MAX_GREP_FILE,
        "max_matches": MAX_MATCHES,
        "clip": MAX_MATCH_LINE,
        "alarm": int(GREP_FILE_SECONDS * 2) + 5,
    }
    child = await asyncio.create_subprocess_exec(
        *_GREP_CHILD,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={},
        pass_fds=(progress,),
        limit=4 * 1024 * 1024,  # one file's line: up to 201 clipped lines, JSON-escaped
    )
    try:
        await asyncio.wait_for(_start(child, json.dumps(job).encode()), GREP_START_SECONDS)
        return await _answers(child, files, progress)
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()


async def _answers(
    child: asyncio.subprocess.Process, files: list[_Named], progress: int
) -> list[tuple[str, list[Any]]]:
    """The child's answer for each file in order, until it stops. It sends them at least every
    FLUSH_SECONDS while it makes progress, so the deadline restarts at each answer; when it
    passes, `progress` says which file the child is on."""
    results: list[tuple[str, list[Any]]] = []
    loop = asyncio.get_running_loop()
    wait = GREP_FILE_SECONDS + grep_child.FLUSH_SECONDS
    try:
        async with asyncio.timeout(wait) as deadline:
            for _ in files:
                line = await _readline(child)
                if not line:  # the child stops by itself once it has found enough
                    if sum(len(found) for _, found in results) <= MAX_MATCHES:
                        raise ToolError(f"the search ended early: {await _child_error(child)}")
                    break
                results.append((files[len(results)].shown, json.loads(line)))
                deadline.reschedule(loop.time() + wait)
    except TimeoutError:
        stuck = files[int.from_bytes(os.pread(progress, 4, 0) or bytes(4), "little")]
        raise ToolError(
            f"the pattern took over {GREP_FILE_SECONDS:g} s on {stuck.shown}: it backtracks "
            "catastrophically; simplify it",
            hint="Nested repetition such as (a+)+ or (.*)* is the usual cause.",
        ) from None
    return results


async def _start(child: asyncio.subprocess.Process, job: bytes) -> None:
    """The job handed over, and the child's word that the pattern compiled."""
    assert child.stdin is not None
    with contextlib.suppress(ConnectionError):  # it died: its stderr says why
        child.stdin.write(job)
        await child.stdin.drain()
        child.stdin.close()
    if await _readline(child) != b'"ready"\n':
        raise ToolError(f"the search could not start: {await _child_error(child)}")


async def _readline(child: asyncio.subprocess.Process) -> bytes:
    assert child.stdout is not None
    return await child.stdout.readline()


async def _child_error(child: asyncio.subprocess.Process) -> str:
    assert child.stderr is not None
    lines = (await child.stderr.read()).decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"its process exited with {await child.wait()}"
