"""git's index.lock in the memory folder (QA17f #9): one left by a git that stopped mid-commit
is removed with a note, so memory saves are committed again; one a git may still hold makes
the commit give up at once, with a one-line warning, and the change itself is kept."""

from __future__ import annotations

import logging
import os
import shutil
import time

import pytest

from heron.memory import history
from heron.memory.history import MemoryHistory

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _repo(tmp_path) -> MemoryHistory:
    root = tmp_path / "memory"
    found = MemoryHistory(root)
    assert found.ensure()
    return found


def _write(found: MemoryHistory, name: str) -> None:
    found.record(f"saved {name}", lambda: (found.root / name).write_text(name + "\n"))


def _messages(found: MemoryHistory) -> list[str]:
    return [c.message for c in found.log()]


def test_a_lock_left_by_a_stopped_git_is_removed_and_the_save_committed(tmp_path, caplog):
    found = _repo(tmp_path)
    lock = found.index_lock
    lock.touch()
    old = time.time() - 5 * 60
    os.utime(lock, (old, old))
    with caplog.at_level(logging.WARNING, logger="heron.memory.history"):
        _write(found, "tea.md")
    assert not lock.exists()
    assert _messages(found)[0] == "saved tea.md"
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "removed" in notes[0] and str(lock) in notes[0]


def test_a_lock_a_git_may_hold_skips_the_commit_with_one_line(tmp_path, caplog, monkeypatch):
    found = _repo(tmp_path)
    sleeps: list[float] = []
    monkeypatch.setattr(history.time, "sleep", sleeps.append)
    found.index_lock.touch()  # just made: its git may still be committing
    with caplog.at_level(logging.WARNING, logger="heron.memory.history"):
        _write(found, "tea.md")
    assert (found.root / "tea.md").read_text() == "tea.md\n"  # the change is kept
    assert found.index_lock.exists()  # not taken from a git that may hold it
    assert sum(sleeps) < 1.0  # the waits between tries, never seconds per save
    notes = [r.getMessage() for r in caplog.records]
    assert notes and all("\n" not in n for n in notes)
    assert all(str(found.index_lock) in n and "remove that file" in n for n in notes)


def test_an_old_lock_is_kept_while_a_git_works_in_the_folder(tmp_path, monkeypatch):
    found = _repo(tmp_path)
    monkeypatch.setattr(history.time, "sleep", lambda s: None)
    monkeypatch.setattr(history, "git_runs_in", lambda root: True)
    lock = found.index_lock
    lock.touch()
    old = time.time() - 5 * 60
    os.utime(lock, (old, old))
    _write(found, "tea.md")
    assert lock.exists()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_git_runs_in_sees_a_git_working_in_the_folder(tmp_path):
    import subprocess

    found = _repo(tmp_path)
    assert not history.git_runs_in(found.root)
    # `git` waiting on stdin in the folder (its process named git, its cwd the folder).
    proc = subprocess.Popen(
        ["git", "hash-object", "--stdin"], cwd=found.root, stdin=subprocess.PIPE
    )
    try:
        for _ in range(100):
            if history.git_runs_in(found.root):
                break
            time.sleep(0.02)
        assert history.git_runs_in(found.root)
    finally:
        proc.communicate(b"x")
