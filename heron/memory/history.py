"""The memory folder's history: a git repository, one commit per change Heron makes.

Every entry Heron writes or removes (a kept suggestion, a save in the user's words, a forget)
is committed, so `heron memory log` shows what changed and when, and `heron memory undo`
restores the folder as it was before the last change (itself a commit, so an undo can be
undone). Edits the person made by hand are committed first, on their own, so a Heron change
never hides them and an undo never takes them away.

It drives the git CLI through subprocess rather than a library (dulwich): git is on every
system Heron runs on, the person can read and repair the same repository with the tools they
know, and Heron gains no dependency. Without git, memory works as before and has no history
(`available` is False; the log and undo commands say so).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from heron.errors import HeronError

# Identity and settings for Heron's own commits, given per command: nothing is written to the
# person's git configuration, and their global settings (signing, hooks) do not apply here.
_CONFIG = (
    "-c",
    "user.name=Heron",
    "-c",
    "user.email=heron@localhost",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "init.defaultBranch=main",
)
IGNORE = ".*.tmp\n"  # MemoryFiles writes through temporary files (entries.py)
# Another git holds the index.lock: wait for it briefly (0.75 s in all; a commit of the memory
# folder takes a few tens of ms), then the commit is skipped with a warning.
LOCK_RETRIES = 5
# An index.lock older than this, with no git working in the folder, was left by a git that
# stopped mid-commit: it is removed (`MemoryHistory._clear_stale_lock`).
STALE_LOCK = 60.0
log = logging.getLogger(__name__)
T = TypeVar("T")
# One lock per memory folder in this process: tool calls of one reply run on threads at once,
# and git allows one writer of a repository at a time.
_LOCKS: dict[Path, threading.RLock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_for(root: Path) -> threading.RLock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(root.resolve(), threading.RLock())


class MemoryHistoryError(HeronError):
    """git failed on the memory folder."""


@dataclass(frozen=True)
class Change:
    commit: str
    when: float
    message: str
    # The commit changes no file: what it changed was taken out of the history (`purge`).
    empty: bool = False
    # For the change an undo took back: the newer empty ones it passed over, newest first.
    skipped: tuple[str, ...] = ()


class MemoryHistory:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.git = shutil.which("git")
        self.lock = _lock_for(root)

    @property
    def available(self) -> bool:
        return self.git is not None

    def _run(self, *args: str, check: bool = True, env: Mapping[str, str] | None = None) -> str:
        assert self.git is not None
        env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", **(env or {})}
        cleared = False
        for attempt in range(LOCK_RETRIES):
            done = subprocess.run(
                [self.git, *_CONFIG, *args],
                cwd=self.root,
                env=env,
                capture_output=True,
                text=True,
            )
            if done.returncode == 0 or "index.lock" not in done.stderr:
                break
            if not cleared and self._clear_stale_lock():
                cleared = True
                continue
            if attempt < LOCK_RETRIES - 1:
                time.sleep(0.05 * 2**attempt)  # on a worker thread; another process commits
        else:
            raise MemoryHistoryError(self._held_lock())
        if check and done.returncode != 0:
            raise MemoryHistoryError(
                f"git {args[0]} failed in {self.root}: {done.stderr.strip() or done.stdout}",
                hint=f"Look at the repository yourself: git -C {self.root} status",
            )
        return done.stdout

    @property
    def index_lock(self) -> Path:
        return self.root / ".git" / "index.lock"

    def _clear_stale_lock(self) -> bool:
        """Remove git's index.lock when the git that made it is gone (killed mid-commit, a
        power loss): older than STALE_LOCK seconds, and no git process works in the folder.
        Left in place, it would stop every commit of the memory folder for good."""
        lock = self.index_lock
        age = _age(lock)
        if age is None or age < STALE_LOCK or git_runs_in(self.root):
            return False
        try:
            lock.unlink()
        except FileNotFoundError:
            return True  # its git just finished
        except OSError:
            return False
        log.warning(
            "heron: memory history: removed %s, left %d s ago by a git that stopped", lock, age
        )
        return True

    def _held_lock(self) -> str:
        """One line: the commit waited briefly and gave up; the change itself is kept."""
        lock = self.index_lock
        age = _age(lock)
        since = f", made {age:.0f} s ago" if age is not None else ""
        return (
            f"{lock} is held{since}: this change is saved but not committed to the history; "
            "if no git runs there, remove that file"
        )

    def ensure(self) -> bool:
        """The repository, created with what the folder holds now; False without git."""
        if not self.available:
            return False
        with self.lock:
            return self._ensure()

    def _ensure(self) -> bool:
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / ".git").exists():
            self._run("init", "-q")
            (self.root / ".gitignore").write_text(IGNORE, encoding="utf-8")
            self.commit(START)
        return True

    def record(self, message: str, change: Callable[[], T]) -> T:
        """Make `change` to the folder as one commit (hand edits before it get their own). A
        git failure is logged, never raised: the change to memory matters more than its
        record."""
        with self.lock:
            try:
                self.before_change()
            except MemoryHistoryError as error:
                log.warning("heron: memory history: %s", error)
            done = change()
            try:
                self.commit(message)
            except MemoryHistoryError as error:
                log.warning("heron: memory history: %s", error)
            return done

    def _dirty(self) -> bool:
        return bool(self._run("status", "--porcelain").strip())

    def before_change(self) -> None:
        """Edits made by hand since the last commit get a commit of their own."""
        if self.ensure() and self._dirty():
            self.commit(HAND)

    def commit(self, message: str) -> bool:
        """Commit everything in the folder; False when nothing changed."""
        if not self.available:
            return False
        self._run("add", "-A")
        if not self._dirty():
            return False
        self._run("commit", "-q", "-m", message)
        return True

    def log(self, limit: int | None = 20) -> list[Change]:
        """The changes, newest first (`limit` of them; None: all)."""
        if not self.ensure():
            return []
        count = () if limit is None else (f"-n{limit}",)
        out = self._run("log", *count, "--name-only", "--format=%x00%h%x09%ct%x09%s")
        changes = []
        for record in out.split("\0")[1:]:
            head, _, files = record.partition("\n")
            commit, when, message = head.split("\t", 2)
            changes.append(Change(commit, float(when), message, empty=not files.strip()))
        return changes

    def undo(self) -> Change | None:
        """Take back the newest change not undone yet, as a new commit (an editor's undo: a
        second undo takes back the change before, not the undo); the change undone, None when
        there is none. Edits made by hand are never undone: they are not Heron's changes."""
        with self.lock:
            self.before_change()
            done, _ = self._stacks()
            if not done:
                return None
            # A change purged from the history holds nothing to take back: it is passed over
            # (and said), and the change before it is undone; it used to stop every undo.
            kept = _past_empty(done)
            if not kept:
                raise MemoryHistoryError(
                    f"the last change ({done[-1].message}) holds nothing to undo, nor any "
                    "before it: what they changed was taken out of the history when it was "
                    "forgotten",
                    hint="Write the entry again if you want it back.",
                )
            last = kept[-1]
            skipped = tuple(c.message for c in reversed(done[len(kept) :]))
            self._revert(last, UNDO)
            return replace(last, skipped=skipped)

    def redo(self) -> Change | None:
        """Make the newest change undone again, as a new commit; the undo taken back, None
        when nothing was undone since the last change."""
        with self.lock:
            self.before_change()
            _, undone = self._stacks()
            if not undone:
                return None
            self._revert(undone[-1], REDO)
            return undone[-1]

    def _revert(self, change: Change, verb: str) -> None:
        """A commit that takes `change` back, named `verb` and what the change did; when a
        file it touched was edited since (by hand), nothing is changed and the error says so."""
        try:
            self._run("revert", "--no-edit", "--no-commit", change.commit)
            self._run("commit", "-q", "-m", f"{verb}{what_it_did(change.message)}")
        except MemoryHistoryError as error:
            self._run("revert", "--abort", check=False)
            raise MemoryHistoryError(
                f"cannot {verb.rstrip(': ')} {what_it_did(change.message)}: a file it changed "
                "was edited since, so nothing was changed",
                hint=f"Edit the file by hand instead; what the change did: git -C {self.root} "
                f"show {change.commit}",
            ) from error

    def _stacks(self) -> tuple[list[Change], list[Change]]:
        """What an undo and a redo would take back, each newest last, replayed from the
        whole log: a change of Heron's goes on the first (and empties the second), an undo
        moves the newest of the first to the second, a redo moves it back. Edits by hand and
        the history's start are on neither. Before redo existed, an undo of an undo was one."""
        done: list[Change] = []
        undone: list[Change] = []
        for change in reversed(self.log(None)):
            kind = _kind(change.message)
            if kind == "undo" and _past_empty(done):
                done = _past_empty(done)  # an undo passes over the empty changes on top
                done.pop()
                undone.append(change)
            elif kind == "redo" and undone:
                undone.pop()
                done.append(change)
            elif kind == "change":
                done.append(change)
                undone.clear()
        return done, undone

    def versions(self, rel: str) -> list[str]:
        """The text of every version of the file `rel` the history holds, newest first (none
        without git): what an entry said before it was updated."""
        if not self.ensure():
            return []
        texts = []
        for commit in self._run("log", "--format=%H", "--", rel).split():
            shown = self._run("show", f"{commit}:{rel}", check=False)  # absent: a removal
            if shown:
                texts.append(shown)
        return texts

    def holds(self, rel: str) -> bool:
        """Whether any commit of the history holds a version of the file `rel`."""
        if not self.ensure():
            return False
        return bool(self._run("rev-list", "-n1", "--all", "--", rel).strip())

    def purge(self, rel: str) -> int:
        """Take every version of the file `rel` out of the history; how many commits changed it.

        git filter-repo is not installed everywhere and filter-branch is deprecated, so the
        branch is written again with git's plumbing: each commit from the first that held the
        file on gets the same tree less `rel`, the same author, dates and message, and the
        rewritten parents. Nothing is changed until the branch moves, in one `update-ref` that
        checks HEAD is still the commit the rewrite began from (another process that committed
        meanwhile makes it fail, with the history as it was). Then the old commits, unreachable,
        are pruned with the reflog. A commit left empty stays, so the log still says what was
        done when; `undo` passes over one. The file must be gone from the folder (forget it
        first): the work tree and the index are not touched."""
        with self.lock:
            if not self.ensure():
                return 0
            self.before_change()
            changed = set(self._run("rev-list", "HEAD", "--", rel).split())
            if not changed:
                return 0
            if self._run("ls-tree", "HEAD", "--", rel).strip():
                raise MemoryHistoryError(f"{rel} is still in memory: forget it before purging it")
            head = self._run("rev-parse", "HEAD").strip()
            new_head = self._rewrite(rel, changed, head)
            self._run("update-ref", "-m", f"purge {rel}", "HEAD", new_head, head)
            self._run("reflog", "expire", "--expire=now", "--expire-unreachable=now", "--all")
            self._run("gc", "--prune=now", "--quiet")
            return len(changed)

    def _rewrite(self, rel: str, changed: set[str], head: str) -> str:
        """The new `head`: every commit that changed `rel`, or descends from one, written again
        without it; the others keep their ids."""
        mapped: dict[str, str] = {}
        index = self.root / ".git" / "heron-purge.index"
        listed = self._run("rev-list", "--reverse", "--topo-order", "--parents", head)
        for line in listed.splitlines():
            commit, *parents = line.split()
            new_parents = [mapped.get(p, p) for p in parents]
            if commit not in changed and new_parents == parents:
                continue
            try:
                self._run("read-tree", commit, env={"GIT_INDEX_FILE": str(index)})
                rm = ("rm", "-q", "--cached", "--ignore-unmatch", "--", rel)
                self._run(*rm, env={"GIT_INDEX_FILE": str(index)})
                tree = self._run("write-tree", env={"GIT_INDEX_FILE": str(index)}).strip()
            finally:
                index.unlink(missing_ok=True)
            mapped[commit] = self._recommit(commit, tree, new_parents)
        return mapped.get(head, head)

    def _recommit(self, commit: str, tree: str, parents: list[str]) -> str:
        """`commit` again with `tree` and `parents`: its author, committer, dates and message."""
        fields = ("%an", "%ae", "%ad", "%cn", "%ce", "%cd", "%B")
        shown = self._run("log", "-1", "--date=raw", f"--format={'%x00'.join(fields)}", commit)
        an, ae, ad, cn, ce, cd, message = shown.split("\0", 6)
        names = "AUTHOR_NAME AUTHOR_EMAIL AUTHOR_DATE COMMITTER_NAME COMMITTER_EMAIL COMMITTER_DATE"
        env = {f"GIT_{n}": v for n, v in zip(names.split(), (an, ae, ad, cn, ce, cd), strict=True)}
        args = ["commit-tree", tree, "-m", message.rstrip("\n") or "(no message)"]
        for parent in parents:
            args += ["-p", parent]
        return self._run(*args, env=env).strip()


UNDO, REDO = "undo: ", "redo: "
HAND = "edited by hand"
START = "memory: the history starts here"


def what_it_did(message: str) -> str:
    """A commit's message without the undo: and redo: before it ("removed x.md")."""
    while message.startswith((UNDO, REDO)):
        message = message[len(UNDO) :]  # both are six characters
    return message


def _kind(message: str) -> str:
    """change, undo or redo (hand edits and the start: neither). An undo before redo existed
    reverted the commit before it, so "undo: undo: x" redid x."""
    if message in (HAND, START):
        return "neither"
    if message.startswith(REDO):
        return "redo"
    depth = 0
    while message.startswith(UNDO):
        message, depth = message[len(UNDO) :], depth + 1
    if depth == 0:
        return "change"
    return "undo" if depth % 2 else "redo"


def _past_empty(done: list[Change]) -> list[Change]:
    """`done` without the empty changes on its top: what an undo passes over."""
    end = len(done)
    while end and done[end - 1].empty:
        end -= 1
    return done[:end]


def _age(path: Path) -> float | None:
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except OSError:
        return None


def git_runs_in(root: Path) -> bool:
    """Whether a git process works in `root` (its current folder there, as `git -C root`
    and Heron's own calls have): read from /proc; where there is none to read (not Linux),
    False, and a lock's age alone decides."""
    proc = Path("/proc")
    if not proc.is_dir():
        return False
    target = root.resolve()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "git":
                continue
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if cwd == target or target in cwd.parents:
            return True
    return False
