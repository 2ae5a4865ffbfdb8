"""Listing every memory entry (done on every turn) reads again only what changed on disk, and
still sees every change made by hand: an edit in place, a new file, a deletion, a new topic."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from heron.memory.entries import MemoryFiles


def write(root: Path, rel: str, body: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body, encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path: Path) -> MemoryFiles:
    return MemoryFiles(tmp_path / "memory")


def texts(files: MemoryFiles) -> list[str]:
    return [e.text for e in files.entries()]


def test_unchanged_files_are_not_read_again(files, monkeypatch):
    write(files.root, "personal/always/tea.md", "Likes green tea.")
    write(files.root, "personal/when/travel/seat.md", "Prefers an aisle seat.")
    assert texts(files) == ["Likes green tea.", "Prefers an aisle seat."]
    reads: list[str] = []
    original = MemoryFiles.read
    monkeypatch.setattr(
        MemoryFiles, "read", lambda self, p: reads.append(p.rel) or original(self, p)
    )
    assert texts(files) == ["Likes green tea.", "Prefers an aisle seat."]
    assert reads == []


def test_an_edit_in_place_of_the_same_size_is_seen(files):
    path = write(files.root, "personal/always/tea.md", "Likes green tea.")
    assert texts(files) == ["Likes green tea."]
    before = path.stat()
    path.write_text("Likes black tea.", encoding="utf-8")  # same size, same inode
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert texts(files) == ["Likes black tea."]


def test_files_and_topics_added_or_removed_by_hand_are_seen(files):
    tea = write(files.root, "personal/always/tea.md", "Likes green tea.")
    assert texts(files) == ["Likes green tea."]
    write(files.root, "personal/when/cooking/salt.md", "Cooks with little salt.")
    write(files.root, "work/always/tz.md", "Works in Berlin time.")
    assert texts(files) == ["Likes green tea.", "Cooks with little salt.", "Works in Berlin time."]
    tea.unlink()
    assert texts(files) == ["Cooks with little salt.", "Works in Berlin time."]


def test_a_file_replaced_by_a_link_out_of_the_tree_is_dropped(files, tmp_path):
    path = write(files.root, "personal/always/tea.md", "Likes green tea.")
    assert texts(files) == ["Likes green tea."]
    outside = write(tmp_path, "secret.md", "Not memory.")
    path.unlink()
    path.symlink_to(outside)
    assert texts(files) == []
