"""Text too large for the model's context, kept whole in the workspace: a tool result over its
budget (when the registry cuts it, or later when the view does) and a user message over its
share. One way to name and write such a file, so the pointer the model reads leads to the text.

Apart from those, the person's copy of every result the model read cut (`keep_whole`), under
HERON_HOME/outputs/ where no tool reaches: `/show N` in `heron chat` prints it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from heron import workspace_io

RESULTS_DIR = Path(".heron") / "results"
MESSAGES_DIR = Path(".heron") / "messages"


def keep(name: str, text: str, workspace: Path | None, folder: Path = RESULTS_DIR) -> str | None:
    """Where `text` is kept: `folder/<name>-<digest>.txt`, relative to the workspace (the
    digest because call ids repeat on some servers; the same text is written once); under the
    temp folder, as an absolute path, when the workspace takes no file (read-only); None without
    a workspace or when nowhere takes it."""
    data = text.encode("utf-8", "replace")
    return keep_bytes(name, hashlib.sha256(data).hexdigest(), lambda: data, workspace, folder)


def keep_bytes(
    name: str,
    sha256: str,
    data: Callable[[], bytes | None],
    workspace: Path | None,
    folder: Path = RESULTS_DIR,
    suffix: str = ".txt",
) -> str | None:
    """`keep` for bytes named by their `sha256` (an attached PDF too large to send, kept as
    `<name>-<digest>.pdf`): `data` is called only when the file is not there yet, and a None
    from it (the bytes are gone) keeps nothing."""
    if workspace is None:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "result"
    relative = folder / f"{safe}-{sha256[:10]}{suffix}"
    try:
        return _kept(workspace, relative, data, str(relative))
    except OSError:  # the workspace refused it: the fallback folder is looked for only now
        private = private_temp()
        if private is None:
            return None
        with contextlib.suppress(OSError):
            return _kept(private, Path(relative.name), data, str(private / relative.name))
        return None


def _kept(root: Path, path: Path, data: Callable[[], bytes | None], shown: str) -> str | None:
    """`shown` once the file is at `path` under `root` (None: the bytes are gone). Through
    workspace_io: the agent's commands may have put a link at the name or on a folder above
    it, which must be replaced, never written through."""
    if not workspace_io.is_file(root, path.as_posix()):
        body = data()
        if body is None:
            return None
        workspace_io.write(root, path.as_posix(), body)
    return shown


def private_temp() -> Path | None:
    """The fallback folder for a copy the workspace refused: this user's own in the system's
    temp folder (`heron-results-UID`, 0700). None when that name is another user's or open to
    others: a folder another local user made first would let them read every copy."""
    path = Path(tempfile.gettempdir()) / f"heron-results-{os.getuid()}"
    try:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = path.lstat()
    except OSError:
        return None
    mine = st.st_uid == os.getuid() and stat.S_ISDIR(st.st_mode)
    return path if mine and not st.st_mode & 0o077 else None


def head(text: str, limit: int) -> str:
    """The first `limit` characters, ending on a whole line when one ends near the limit."""
    shown = text[:limit]
    cut = shown.rfind("\n")
    return shown[:cut] if cut > limit * 0.8 else shown


def tail(text: str, limit: int) -> str:
    """The last `limit` characters, starting on a whole line when one starts near the limit."""
    shown = text[-limit:] if limit > 0 else ""
    if len(shown) == len(text):
        return shown
    start = shown.find("\n")
    return shown[start + 1 :] if 0 <= start < limit * 0.2 else shown


# ---- a text cut to its head and tail -----------------------------------------------------------

# The line a cut puts between what it kept: this module's ("left out") and the one the tools
# write while output streams (heron/tools/shell.py `HeadTail`, "omitted"). A later cut of a
# text that holds one folds it into its own, so the model reads one count of the original.
_MARKER = re.compile(
    r"\n\[\.\.\. ([\d,]+) (?:of [\d,]+ )?characters (?:omitted|left out)[^\n]*\]\n"
)
_SAVED_IN = re.compile(r"The full result is saved in (\S+?\.txt)")  # the whole, not a cut
READ_ON = "read it with read_file (offset, limit) or search it with grep"


@dataclass(frozen=True)
class Cut:
    """What is kept of a text cut to a budget: its head and its tail (where a command's exit
    code, a traceback or a paging footer is), with the count of what lies between."""

    head: str
    tail: str
    omitted: int  # characters of the original left out, an earlier cut's included
    total: int  # characters of the original
    saved: str | None = None  # where an earlier cut said the whole of it is saved

    def text(self, where: str = "") -> str:
        """The head and tail around one line saying what was left out (`where`: a sentence
        naming where the whole is, or nothing)."""
        said = f"[... {self.omitted:,} of {self.total:,} characters left out here.{where}]"
        return f"{self.head}\n{said}\n{self.tail}"


def earlier_cut(text: str) -> Cut | None:
    """The head, tail and count of a text already cut (a command's output the tool kept head
    and tail of), or None when it holds no cut's line."""
    found = _MARKER.search(text)
    if found is None:
        return None
    first, rest = text[: found.start()], text[found.end() :]
    omitted = int(found.group(1).replace(",", ""))
    saved = _SAVED_IN.search(found.group(0))
    path = saved.group(1) if saved else None
    return Cut(first, rest, omitted, len(first) + omitted + len(rest), path)


def cut_middle(text: str, limit: int) -> Cut | None:
    """`text` cut to about `limit` characters, half head and half tail (each on whole lines
    when one ends near its edge), or None when it fits. A text already cut keeps its head and
    tail apart: the new cut takes from each, and one count says what is left of the original,
    so the end of the text (its last lines: an exit code, a footer) is always kept."""
    if len(text) <= limit:
        return None
    found = earlier_cut(text) or Cut(text, "", 0, len(text))
    first, rest = found.head, found.tail
    if not rest:  # nothing cut before: both ends come from the one text
        first, rest = text[: len(text) // 2], text[len(text) // 2 :]
    keep_first = min(len(first), limit // 2)
    keep_rest = min(len(rest), limit - keep_first)
    keep_first = min(len(first), limit - keep_rest)  # what the tail leaves goes to the head
    kept_head = first if len(first) <= keep_first else head(first, keep_first)
    kept_tail = tail(rest, keep_rest)
    omitted = found.omitted + len(first) + len(rest) - len(kept_head) - len(kept_tail)
    return Cut(kept_head, kept_tail, omitted, found.total, found.saved)


# ---- the person's copy of a cut result ---------------------------------------------------------

WHOLE_DIR = "outputs"  # under HERON_HOME, which no tool command can see (heron/tools/sandbox.py)
WHOLE_CAP = 2_000_000  # characters kept of one result (the bash tool keeps head and tail)
WHOLE_KEPT = 200  # files: the oldest go as new ones come


class ToolResult(Protocol):
    """What names a kept result (heron/messages.py's ToolResult; this module imports no other)."""

    @property
    def call_id(self) -> str: ...

    @property
    def content(self) -> str: ...


def whole_path(home: Path, result: ToolResult) -> Path:
    """Where the whole of a result the model read cut is kept, named by the call and what the
    model read: a channel that has the result (the pill of `heron chat`, in-process or through
    a serve) finds the file with nothing more said."""
    named = f"{result.call_id}\0{result.content}".encode("utf-8", "replace")
    return home / WHOLE_DIR / f"{hashlib.sha256(named).hexdigest()[:24]}.txt"


def keep_whole(home: Path, result: ToolResult, text: str) -> Path | None:
    """Keep `text` (the whole of `result`, capped at WHOLE_CAP characters, said so) for the
    person's /show N, and forget all but the newest WHOLE_KEPT such files; None when the home
    takes no file."""
    if len(text) > WHOLE_CAP:
        left = len(text) - WHOLE_CAP
        half = WHOLE_CAP // 2
        said = f"[... {left} characters omitted: at most {WHOLE_CAP:,} are kept ...]"
        text = f"{text[:half]}\n{said}\n{text[-half:]}"
    path = whole_path(home, result)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", errors="replace")
    except OSError:
        return None
    _forget_old(path.parent)
    return path


def _forget_old(folder: Path) -> None:
    try:
        found = [(e.stat().st_mtime_ns, e.path) for e in os.scandir(folder) if e.is_file()]
    except OSError:
        return
    for _, old in sorted(found)[: max(0, len(found) - WHOLE_KEPT)]:
        with contextlib.suppress(OSError):
            os.unlink(old)


def read_whole(home: Path, result: ToolResult) -> str | None:
    """The whole of `result` as kept for the person, or None when none was (it was not cut)."""
    try:
        return whole_path(home, result).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
