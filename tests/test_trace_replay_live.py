"""`heron trace replay --live-tools` runs the recorded tool calls again: on a copy of the
workspace, so the person's files are never touched; a workspace too big to copy is refused,
naming the calls that change files, and `--in-place` runs them in the workspace itself, naming
them first (heron/agent/replay_workspace.py, heron/channels/trace_cli.py)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from heron.agent import replay_workspace
from heron.agent.engine import Engine
from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage

PRECIOUS = "precious data the person wrote since\n"


async def _record() -> str:
    """A run whose calls edit notes.txt and write dup.txt; the run id."""
    from heron.providers.scripted import ScriptedProvider

    settings = Settings.load()
    workspace = settings.paths.workspace
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.txt").write_text("draft\n")
    calls = [
        ToolCall("c1", "edit_file", {"path": "notes.txt", "old": "draft", "new": "final"}),
        ToolCall("c2", "write_file", {"path": "dup.txt", "content": "overwritten\n"}),
        ToolCall("c3", "read_file", {"path": "notes.txt"}),
    ]
    provider = ScriptedProvider(
        [Reply(calls, "tool", Usage(10, 1)), Reply([Text("Done.")], "done", Usage(12, 1))]
    )
    async with Engine.open(settings, provider=provider) as engine:
        return (await engine.turn("live", "finish the notes")).run_id


@pytest.fixture
def recorded(heron_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    run_id = asyncio.run(_record())
    (heron_home / "workspace" / "dup.txt").write_text(PRECIOUS)  # the person's, since the run
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the copy goes: checked empty
    return run_id


def _replay(*flags: str) -> Result:
    return CliRunner().invoke(app, ["trace", "replay", *flags])


def test_live_tools_run_on_a_copy_and_leave_the_persons_files_alone(
    recorded: str, heron_home: Path, tmp_path: Path
) -> None:
    workspace = heron_home / "workspace"
    result = _replay(recorded, "--live-tools")
    assert (workspace / "dup.txt").read_text() == PRECIOUS
    assert (workspace / "notes.txt").read_text() == "final\n"
    assert "copy of the workspace" in result.stderr
    assert "tool edit_file [c1] result differs" in result.stdout  # "draft" is gone by now
    assert list((tmp_path / "tmp").iterdir()) == []  # the copy is discarded


def test_a_workspace_too_big_to_copy_is_refused_naming_the_calls_that_write(
    recorded: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_workspace, "MAX_COPY_BYTES", 10)
    result = _replay(recorded, "--live-tools")
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())
    assert "too big to copy" in said and "nothing was run" in said
    assert "--in-place" in said
    assert "edit_file notes.txt" in said and "write_file dup.txt" in said
    assert "read_file" not in said  # it changes nothing
    assert (heron_home / "workspace" / "dup.txt").read_text() == PRECIOUS


def test_in_place_runs_in_the_workspace_and_names_the_calls_first(
    recorded: str, heron_home: Path
) -> None:
    result = _replay(recorded, "--live-tools", "--in-place")
    said = " ".join(result.stderr.split())
    assert "in the workspace itself" in said
    assert "write_file dup.txt" in said and "edit_file notes.txt" in said
    assert (heron_home / "workspace" / "dup.txt").read_text() == "overwritten\n"


def test_in_place_without_live_tools_is_refused(recorded: str) -> None:
    result = _replay(recorded, "--in-place")
    assert result.exit_code == 2
    assert "--in-place" in result.stderr and "--live-tools" in result.stderr


def test_the_copy_keeps_links_inside_and_leaves_out_fifos(tmp_path: Path) -> None:
    """A link naming a file of the workspace by its absolute path would let a live tool write
    through it into the workspace: in the copy it names the copy's file."""
    source, target = tmp_path / "ws", tmp_path / "copy"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "data.txt").write_text("mine\n")
    (source / "abs").symlink_to(source / "sub" / "data.txt")
    (source / "rel").symlink_to("sub/data.txt")
    os.mkfifo(source / "pipe")
    assert replay_workspace.copy_workspace(source, target) == []
    assert os.readlink(target / "abs") == str(target / "sub" / "data.txt")
    assert os.readlink(target / "rel") == "sub/data.txt"
    assert not (target / "pipe").exists()
    (target / "abs").write_text("changed\n")
    assert (source / "sub" / "data.txt").read_text() == "mine\n"
