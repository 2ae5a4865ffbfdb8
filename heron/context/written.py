"""Which bootstrap files Heron's own tools wrote last, so the prompt does not pass them off as
the person's words.

`AGENTS.md`, `SOUL.md` and `USER.md` are ordinary workspace files: `write_file`, `edit_file`,
`bash` and `run_cell` can write them, and every later conversation's system prompt carries them
(qa24d Medium 1: a prompt injection read once wrote itself into USER.md, "About you, in your
own words"). Heron cannot tell who typed a file's bytes, but it knows when its tools changed
one: `ToolWrites.watching` compares the files' stamps before and after a run's tool calls and,
for each file they changed, records the digest it was left with and the day, in a small file
under HERON_HOME (`MARKS_FILE`), out of every command's reach. While a file's digest is still
the one recorded, the prompt labels its section as the agent's notes; any other change (the
person's edit) makes the digests differ and the label goes. Code:
heron/context/prompt.py (`BootstrapCache`, `bootstrap_section`), heron/agent/runner.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from heron import workspace_io

log = logging.getLogger(__name__)

BOOTSTRAP_FILES = ("AGENTS.md", "SOUL.md", "USER.md")
BOOTSTRAP_MAX = 256 * 1024  # bytes read of one bootstrap file; the prompt's budget warns far below
MARKS_FILE = "bootstrap-written.json"  # under HERON_HOME: {name: {"digest", "day"}}
MARKS_MAX = 64 * 1024  # three small entries; anything larger is not Heron's


def digest_of(found: workspace_io.Read) -> str:
    """A file's digest as Heron reads it for the prompt: its first BOOTSTRAP_MAX bytes and its
    size (a change past the bound still counts)."""
    return hashlib.sha256(found.data + b"\0" + str(found.size).encode()).hexdigest()


def file_digest(workspace: Path, name: str) -> str | None:
    """`digest_of` the bootstrap file `name`, or None where Heron reads none (absent, a link,
    not a regular file)."""
    try:
        return digest_of(workspace_io.read(workspace, name, BOOTSTRAP_MAX))
    except OSError:
        return None


def stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)  # a link swapped in is a change
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def load_marks(path: Path) -> dict[str, dict[str, str]]:
    """The recorded marks; {} when there are none or the file is not one Heron wrote."""
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(MARKS_MAX))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        name: {"digest": str(mark["digest"]), "day": str(mark.get("day", ""))}
        for name, mark in data.items()
        if name in BOOTSTRAP_FILES and isinstance(mark, dict) and "digest" in mark
    }


def _save_marks(path: Path, marks: dict[str, dict[str, str]]) -> None:
    """Written whole under a temporary name, then renamed: a reader in another process (the
    serve beside a chat) sees the old marks or the new ones."""
    fd, temp = tempfile.mkstemp(prefix=".bootstrap-written-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(marks, f, sort_keys=True)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def written_by_tools(marks: dict[str, dict[str, str]], digests: dict[str, str]) -> dict[str, str]:
    """name -> the day Heron's tools last changed it, for the files still as they left them."""
    return {
        name: mark["day"]
        for name, mark in marks.items()
        if digests.get(name) is not None and digests[name] == mark["digest"]
    }


class ToolWrites:
    """Records the bootstrap files a run's tool calls changed (`watching`), for one workspace."""

    def __init__(self, workspace: Path, marks: Path, today: Callable[[float], str]) -> None:
        self.workspace = workspace
        self.marks = marks
        self.today = today  # the agent's calendar day of an instant, as the label shows it
        self._paths = [str(workspace / name) for name in BOOTSTRAP_FILES]
        # name -> (stamp, digest) as last read: a batch that changes nothing costs six stat
        # calls, no read.
        self._known: dict[str, tuple[object, str | None]] = {}

    def _digests(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for name, path in zip(BOOTSTRAP_FILES, self._paths, strict=True):
            now = stamp(path)
            held = self._known.get(name)
            if held is None or held[0] != now:
                held = (now, file_digest(self.workspace, name) if now else None)
                self._known[name] = held
            out[name] = held[1]
        return out

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Around a batch of tool calls: the files' digests before and after (read again only
        when a file's stamp moved), and a record only when one's content changed, so a `touch`
        does not make the person's file the agent's. A stopped batch is compared too."""
        before = self._digests()
        try:
            yield
        finally:
            after = self._digests()
            changed = [name for name in BOOTSTRAP_FILES if after[name] != before[name]]
            if changed:
                try:
                    self.record({name: after[name] for name in changed})
                except OSError:  # the turn goes on; the file is then shown unlabelled
                    log.warning("could not record the workspace files the tools changed")

    def record(self, digests: dict[str, str | None]) -> None:
        marks = load_marks(self.marks)
        day = self.today(time.time())
        for name, digest in digests.items():
            if digest is None:
                marks.pop(name, None)  # gone, or nothing the prompt reads
            else:
                marks[name] = {"digest": digest, "day": day}
        _save_marks(self.marks, marks)
