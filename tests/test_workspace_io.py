"""heron/workspace_io.py: Heron's own reads and writes inside the workspace never follow a
link, never block on a FIFO, never leave the root (the agent's commands write the workspace)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from heron import workspace_io
from heron.context.prompt import BOOTSTRAP_MAX, install_templates, read_bootstrap
from heron.saved import MESSAGES_DIR, keep, keep_bytes


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "outside").mkdir()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return workspace


def outside(ws: Path) -> Path:
    return ws.parent / "outside"


def test_a_new_file_is_written_and_read_back(ws: Path) -> None:
    assert workspace_io.write(ws, "a/b/c.txt", b"hello")
    assert (ws / "a/b/c.txt").read_bytes() == b"hello"
    got = workspace_io.read(ws, "a/b/c.txt", 3)
    assert (got.data, got.size, got.whole) == (b"hel", 5, False)
    assert [p.name for p in (ws / "a/b").iterdir()] == ["c.txt"]  # no temporary left


@pytest.mark.parametrize("where", ["the name", "a folder above"])
def test_a_link_is_replaced_or_refused_never_written_through(ws: Path, where: str) -> None:
    if where == "the name":
        (ws / "d").mkdir()
        (ws / "d/f.txt").symlink_to(outside(ws) / "planted")  # dangling
        assert workspace_io.write(ws, "d/f.txt", b"mine")
        assert not (ws / "d/f.txt").is_symlink() and (ws / "d/f.txt").read_bytes() == b"mine"
    else:
        (ws / "d").symlink_to(outside(ws))  # a folder swapped for a link
        with pytest.raises(workspace_io.Refused):
            workspace_io.write(ws, "d/f.txt", b"mine")
    assert list(outside(ws).iterdir()) == []


def test_exclusive_leaves_whatever_stands_at_the_name(ws: Path) -> None:
    (ws / "AGENTS.md").symlink_to(outside(ws) / "agents")  # dangling
    assert not workspace_io.write(ws, "AGENTS.md", b"template", exclusive=True)
    assert (ws / "AGENTS.md").is_symlink() and list(outside(ws).iterdir()) == []
    assert workspace_io.write(ws, "SOUL.md", b"template", exclusive=True)
    assert not workspace_io.write(ws, "SOUL.md", b"other", exclusive=True)
    assert (ws / "SOUL.md").read_bytes() == b"template"


@pytest.mark.parametrize("kind", ["link at the name", "linked folder", "link higher up"])
def test_reads_never_follow_a_link(ws: Path, kind: str) -> None:
    (outside(ws) / "secret").write_text("config key")
    (ws / "a").mkdir()
    if kind == "link at the name":
        (ws / "a/f").symlink_to(outside(ws) / "secret")
    elif kind == "linked folder":
        (ws / "a/b").symlink_to(outside(ws))
    else:
        os.rmdir(ws / "a")
        (ws / "a").symlink_to(outside(ws))
    path = {"link at the name": "a/f", "linked folder": "a/b/secret"}.get(kind, "a/secret")
    with pytest.raises(workspace_io.Refused):
        workspace_io.read(ws, path, 100)
    assert workspace_io.lstat(ws, path) is None or kind == "link at the name"
    assert not workspace_io.is_file(ws, path)


@pytest.mark.parametrize("path", ["../outside/secret", "/etc/passwd", ".", "a/../../x"])
def test_a_path_that_leaves_the_root_is_refused(ws: Path, path: str) -> None:
    with pytest.raises(workspace_io.Refused):
        workspace_io.read(ws, path, 100)
    with pytest.raises(workspace_io.Refused):
        workspace_io.write(ws, path, b"x")


def test_a_fifo_answers_at_once_and_is_refused(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    outcome: list[str] = []

    def each() -> None:
        for call in (
            lambda: workspace_io.read(ws, "pipe", 10),
            lambda: workspace_io.replace(ws, "pipe", b"x"),
        ):
            try:
                call()
            except workspace_io.Refused as refused:
                outcome.append(str(refused))

    thread = threading.Thread(target=each, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "a FIFO blocked the open"
    assert len(outcome) == 2 and all("not a regular file" in said for said in outcome)


def test_append_replaces_a_link_or_a_hard_link(ws: Path) -> None:
    target = outside(ws) / "bash_profile"
    target.write_text("original\n")
    (ws / ".heron").mkdir()
    for make in (lambda p: p.symlink_to(target), lambda p: os.link(target, p)):
        log = ws / ".heron/kernel.log"
        log.unlink(missing_ok=True)
        make(log)
        fd = workspace_io.append_to(ws, ".heron/kernel.log")
        os.write(fd, b"kernel says\n")
        os.close(fd)
        assert target.read_text() == "original\n"
        assert not log.is_symlink() and log.stat().st_nlink == 1
    assert log.read_text() == "kernel says\n"


def test_saved_results_never_land_outside(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(ws.parent / "tmp"))
    (ws.parent / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    first = keep("call_1", "PWNED\n" * 3000, ws)
    assert first and (ws / first).is_file()
    (ws / first).unlink()
    (ws / first).symlink_to(outside(ws) / "bash_profile")  # dangling, at the exact name
    assert keep("call_1", "PWNED\n" * 3000, ws) == first
    assert not (ws / first).is_symlink()
    # The folder itself swapped for a link: the copy goes to the temp folder instead.
    (ws / ".heron/messages").symlink_to(outside(ws))
    where = keep_bytes("m", "ab" * 32, lambda: b"data", ws, MESSAGES_DIR)
    assert where and where.startswith(str(ws.parent / "tmp"))
    assert list(outside(ws).iterdir()) == []


def test_templates_are_not_written_through_a_dangling_link(ws: Path) -> None:
    (ws / "USER.md").symlink_to(outside(ws) / "config.toml")
    assert install_templates(ws) == ["AGENTS.md", "SOUL.md"]
    assert list(outside(ws).iterdir()) == []


def test_bootstrap_files_are_regular_files_read_bounded(ws: Path) -> None:
    os.mkfifo(ws / "AGENTS.md")  # would block a plain open for ever
    with open(ws / "SOUL.md", "wb") as f:
        f.truncate(BOOTSTRAP_MAX * 64)  # sparse: the read stops at the bound
    (ws / "USER.md").symlink_to("/proc/self/environ")
    files = read_bootstrap(ws, clean=lambda text: text.replace("\0", "0"))
    assert list(files) == ["SOUL.md"]
    assert files["SOUL.md"].startswith("0" * BOOTSTRAP_MAX)
    assert files["SOUL.md"].endswith(f"only the first {BOOTSTRAP_MAX:,} are read]")


def test_the_fallback_for_a_copy_is_the_users_own_folder(tmp_path, monkeypatch):
    """A linked results folder sent the copy to the shared temp folder's `heron-results`,
    which another local user could make first and read."""
    import tempfile

    from heron import saved

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    private = saved.private_temp()
    assert private is not None and private.name == f"heron-results-{os.getuid()}"
    assert (private.stat().st_mode & 0o777) == 0o700
    private.chmod(0o755)  # open to others: not used
    assert saved.private_temp() is None
