"""The workspace is shared by every turn of a home (two conversations, a subagent, a goal, a job,
and by `heron run` beside a serve): edit_file and write_file of one file from concurrent turns
never lose an edit they reported, and a reader never sees a half-written file
(heron/tools/files.py, heron/file_locks.py, heron/workspace_io.py `replace`)."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from heron import file_locks, workspace_io
from heron.errors import ToolError
from heron.tools.context import ToolContext, TurnServices
from heron.tools.files import edit_file, write_file

KEYS = 40  # edits per writer
FILLER = 20_000  # lines after the keys: the file is large enough for a write to take a while


def _seed(workspace: Path) -> Path:
    workspace.mkdir(parents=True, exist_ok=True)
    target = workspace / "shared.txt"
    keys = "".join(f"key{i}\n" for i in range(2 * KEYS))
    filler = "".join(f"filler line {i} with some padding text\n" for i in range(FILLER))
    target.write_text(keys + filler)
    return target


def _turn(workspace: Path, home: Path) -> ToolContext:
    """The tools' context of one turn of the home (each turn has its own)."""
    return ToolContext(workspace=workspace, services=TurnServices(home=home))


def _edits(ctx: ToolContext, first: int, said: list[str]) -> None:
    for i in range(first, first + KEYS):
        try:
            said.append(edit_file(ctx, "shared.txt", f"key{i}\n", f"EDIT{i}\n"))
        except ToolError as error:
            said.append(f"Error: {error}")


def test_concurrent_edits_from_two_turns_are_all_kept(tmp_path: Path) -> None:
    workspace, home = tmp_path / "ws", tmp_path / "home"
    target = _seed(workspace)
    said: list[list[str]] = [[], []]
    writers = [
        threading.Thread(target=_edits, args=(_turn(workspace, home), n * KEYS, said[n]))
        for n in range(2)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    text = target.read_text()
    told = [line for lines in said for line in lines]
    assert [line for line in told if not line.startswith("Replaced 1")] == []
    assert [i for i in range(2 * KEYS) if f"EDIT{i}\n" not in text] == []
    assert text.count("filler line") == FILLER  # nothing cut


_CHILD = """
import sys
from pathlib import Path
from heron.errors import ToolError
from heron.tools.context import ToolContext, TurnServices
from heron.tools.files import edit_file
workspace, home = Path(sys.argv[1]), Path(sys.argv[2])
first, count = int(sys.argv[3]), int(sys.argv[4])
ctx = ToolContext(workspace=workspace, services=TurnServices(home=home))
for i in range(first, first + count):
    try:
        print(edit_file(ctx, "shared.txt", f"key{i}\\n", f"EDIT{i}\\n"), flush=True)
    except ToolError as error:
        print(f"Error: {error}", flush=True)
"""


def test_concurrent_edits_from_two_processes_are_all_kept(tmp_path: Path) -> None:
    """`heron run` beside a `heron serve`, or two workers: the lock holds across processes."""
    workspace, home = tmp_path / "ws", tmp_path / "home"
    target = _seed(workspace)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(workspace), str(home), str(n * KEYS), str(KEYS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(2)
    ]
    outputs = [child.communicate() for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs
    told = [line for out, _ in outputs for line in out.splitlines()]
    assert len(told) == 2 * KEYS
    assert [line for line in told if not line.startswith("Replaced 1")] == []
    text = target.read_text()
    assert [i for i in range(2 * KEYS) if f"EDIT{i}\n" not in text] == []


def test_a_reader_sees_the_old_or_the_new_whole_file(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    versions = [b"a" * 2_000_000, b"b" * 1_000_000]
    (workspace / "big.txt").write_bytes(versions[0])
    ctx = _turn(workspace, tmp_path / "home")
    done = threading.Event()
    partial: list[int] = []  # the sizes of what a reader saw that was neither version

    def read_until_done() -> None:
        while not done.is_set():
            data = (workspace / "big.txt").read_bytes()
            if data not in versions:
                partial.append(len(data))

    reader = threading.Thread(target=read_until_done)
    reader.start()
    try:
        for n in range(30):  # bounded by count: each write swaps the file's whole content
            write_file(ctx, "big.txt", versions[(n + 1) % 2].decode())
    finally:
        done.set()
        reader.join()
    assert partial == []
    assert (workspace / "big.txt").read_bytes() == versions[0]


def test_a_write_keeps_the_files_mode_and_leaves_no_temporary(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    target = _seed(workspace)
    target.chmod(0o640)
    ctx = _turn(workspace, tmp_path / "home")
    edit_file(ctx, "shared.txt", "key0\n", "EDIT0\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in workspace.iterdir()) == ["shared.txt"]


def test_a_hard_link_inside_keeps_both_names_on_one_file(tmp_path: Path) -> None:
    """A rename would part the two names: a file with another name inside is written in place,
    so both names still show the change."""
    workspace = tmp_path / "ws"
    target = _seed(workspace)
    os.link(target, workspace / "also.txt")
    edit_file(_turn(workspace, tmp_path / "home"), "also.txt", "key3\n", "EDIT3\n")
    assert "EDIT3\n" in target.read_text()
    assert os.path.samefile(target, workspace / "also.txt")


def test_a_folder_that_takes_no_new_file_is_written_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder where the file may be written but no temporary made (its permissions, a bind
    mount of the one file): the edit is made in place rather than refused."""
    workspace = tmp_path / "ws"
    target = _seed(workspace)
    real = workspace_io.open_regular

    def no_new_files(fd: int, name: str, flags: int, shown: str):
        if flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(fd, name, flags, shown)

    monkeypatch.setattr(workspace_io, "open_regular", no_new_files)
    assert edit_file(_turn(workspace, tmp_path / "home"), "shared.txt", "key1\n", "E1\n")
    assert "E1\n" in target.read_text() and target.read_text().count("filler line") == FILLER


def test_a_write_that_fails_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: the edit is refused with the reason, and the file is whole (truncating in
    place first lost it)."""
    workspace = tmp_path / "ws"
    target = _seed(workspace)
    before = target.read_bytes()

    def disk_full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(workspace_io, "_write_all", disk_full)
    with pytest.raises(ToolError, match=r"No space left on device.*nothing was changed"):
        edit_file(_turn(workspace, tmp_path / "home"), "shared.txt", "key1\n", "E1\n")
    assert target.read_bytes() == before
    assert sorted(p.name for p in workspace.iterdir()) == ["shared.txt"]


def test_a_lock_held_too_long_is_said_and_nothing_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace, home = tmp_path / "ws", tmp_path / "home"
    target = _seed(workspace)
    before = target.read_bytes()
    monkeypatch.setattr(file_locks, "WAIT_SECONDS", 0.0)
    with (
        file_locks.held(home, target.resolve()),  # another turn's write, stuck
        pytest.raises(ToolError, match=r"another call is changing shared\.txt"),
    ):
        edit_file(_turn(workspace, home), "shared.txt", "key1\n", "E1\n")
    assert target.read_bytes() == before
