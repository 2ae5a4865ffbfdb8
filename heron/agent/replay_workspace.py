"""Where `heron trace replay --live-tools` runs the recorded tool calls again.

A replay reads as harmless ("the store is never written"), but its live tools repeat what the
run did: a `write_file`, an `edit_file`, a `bash` that removed or reset files. Run on the
person's workspace, they overwrote what the person had written there since. So they run on a
copy of the workspace in a temporary folder, discarded after. The copy is the workspace as it
is now, not as the run found it (nothing kept that state), so a result that depends on a file
changed since differs, and the report says where.

A workspace too big to copy (MAX_COPY_BYTES, MAX_COPY_FILES, or the temporary folder's free
space) is refused, naming the run's calls that change files; `--in-place` runs them in the
workspace itself, and names them first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from heron.errors import HeronError
from heron.tools.registry import ToolRegistry
from heron.trace.read import RunTrace

MAX_COPY_BYTES = 1 << 30  # 1 GiB
MAX_COPY_FILES = 100_000
_SHOWN_ARGS = ("path", "command", "code")  # what names a writing call best, in this order
_SHOWN_WIDTH = 70


class LiveToolsRefused(HeronError):
    """The live tools cannot run on a copy, and running them in place was not asked for."""


@dataclass(frozen=True)
class Size:
    bytes: int
    files: int

    @property
    def too_big(self) -> bool:
        return self.bytes > MAX_COPY_BYTES or self.files > MAX_COPY_FILES

    def __str__(self) -> str:
        return f"{_amount(self.bytes)} in {self.files:,} files and folders"


@contextlib.contextmanager
def live_folder(
    workspace: Path,
    run: Callable[[], RunTrace],
    registry: ToolRegistry,
    *,
    in_place: bool,
    say: Callable[[str], None],
) -> Iterator[Path]:
    """The folder the live tools run in: a copy of `workspace`, removed on leaving, or
    `workspace` itself when `in_place` (the run's calls that change files said first, through
    `say`). `run` loads the recorded run, only when its calls are to be named."""
    if in_place:
        say(_in_place_notice(workspace, writing_calls(run(), registry)))
        yield workspace
        return
    size = measure(workspace)
    with tempfile.TemporaryDirectory(prefix="heron-replay-") as scratch:
        _check_room(size, Path(scratch), lambda: writing_calls(run(), registry))
        copy = Path(scratch) / "workspace"
        missed = copy_workspace(workspace, copy)
        say(
            f"live tools run in a copy of the workspace ({size}) as it is now, not as the run "
            "found it; the copy is discarded after"
        )
        for problem in missed[:5]:
            say(f"not copied: {problem}")
        yield copy


def measure(root: Path) -> Size:
    """The bytes of the regular files under `root` and how many entries there are (links not
    followed); stops counting once past the limits."""
    total = files = 0
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            files += 1
            with contextlib.suppress(OSError):
                found = os.lstat(os.path.join(folder, name))
                if stat.S_ISREG(found.st_mode):
                    total += found.st_size
        if total > MAX_COPY_BYTES or files > MAX_COPY_FILES:
            break
    return Size(total, files)


def _check_room(size: Size, scratch: Path, calls: Callable[[], list[str]]) -> None:
    free = shutil.disk_usage(scratch).free
    if size.too_big:
        why = f"the limit is {_amount(MAX_COPY_BYTES)} or {MAX_COPY_FILES:,} files and folders"
    elif size.bytes > free:
        why = f"{scratch.parent} has {_amount(free)} free; TMPDIR names another folder"
    else:
        return
    raise LiveToolsRefused(
        f"the workspace ({size}) is too big to copy for a live replay ({why}); nothing was run",
        hint="Replay without --live-tools (the tool results are served from the trace), or "
        "add --in-place to run the tools in the workspace itself. "
        + _repeats(calls(), "That repeats"),
    )


def _in_place_notice(workspace: Path, calls: list[str]) -> str:
    return f"--in-place: live tools run in the workspace itself ({workspace}). " + _repeats(
        calls, "This repeats"
    )


def _repeats(calls: list[str], lead: str) -> str:
    if not calls:
        return "None of the run's calls changes files."
    listed = "; ".join(calls[:10]) + (f"; and {len(calls) - 10} more" if len(calls) > 10 else "")
    return f"{lead} the run's {len(calls)} call(s) that change files: {listed}."


def writing_calls(run: RunTrace, registry: ToolRegistry) -> list[str]:
    """The run's recorded calls of tools that change the workspace (`writes=True`; a tool
    this Heron does not know counts too), each as its name and what it names. A call the
    run was stopped in, or one of its retry after a context overflow, is not repeated: the
    replay stops before it."""
    shown: list[str] = []
    for call in run.tools:
        if call.interrupted or call.attempt > 1:
            continue
        found = registry.get(call.name)
        if found is None or found.writes:
            shown.append(f"{call.name} {_what(call.args)}".strip())
    return shown


def _what(args: str) -> str:
    """The argument that names what a call changes (a path, a command, code), on one line."""
    try:
        parsed = json.loads(args)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return ""
    text = next((str(parsed[k]) for k in _SHOWN_ARGS if k in parsed), "")
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN_WIDTH else text[: _SHOWN_WIDTH - 1] + "…"


def copy_workspace(source: Path, target: Path) -> list[str]:
    """`source` copied to `target`: folders, regular files (with their modes) and symbolic
    links, a link that named a place inside `source` by its absolute path made to name the same
    place in the copy (the live tools must not write through it into the workspace). FIFOs,
    sockets and devices are left out (opening one to copy it would wait or read a device).
    What could not be copied, each as "path: why"."""
    missed: list[str] = []
    try:
        shutil.copytree(source, target, symlinks=True, copy_function=_copy_regular)
    except shutil.Error as error:
        missed = [f"{src}: {why}" for src, _dst, why in error.args[0]]
    _relink(source, target)
    return missed


def _copy_regular(src: str, dst: str) -> str:
    if stat.S_ISREG(os.lstat(src).st_mode):
        shutil.copy2(src, dst, follow_symlinks=False)
    return dst


def _relink(source: Path, target: Path) -> None:
    roots = {str(source), str(source.resolve())}
    for folder, dirs, names in os.walk(target):
        for name in [*dirs, *names]:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                continue
            points = os.readlink(path)
            for root in roots:
                if points == root or points.startswith(root + os.sep):
                    os.unlink(path)
                    os.symlink(str(target) + points[len(root) :], path)
                    break


def _amount(size: int) -> str:
    for unit, step in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= step:
            return f"{size / step:.1f} {unit}"
    return f"{size} bytes"
