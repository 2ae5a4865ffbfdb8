"""Attachments from the terminal: `heron run -a FILE` and `/attach PATH` in `heron chat`, in
this process and through a running `heron serve` (the bytes over the control socket), and the
refusals: a missing file, one over the cap."""

from __future__ import annotations

import asyncio
import io
import json
import os
from contextlib import AsyncExitStack
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from serve_helpers import running_serve
from typer.testing import CliRunner

from heron.channels import script, terminal
from heron.channels.remote import connect_remote, serve_socket
from heron.channels.script import attached_files, run_message, run_once
from heron.cli import app
from heron.config import Settings
from heron.messages import File, Reply, Text
from heron.providers.scripted import ScriptedProvider

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))


def _seen(request: Any) -> Reply:
    files = [p for p in request.messages[-1].parts if isinstance(p, File)]
    said = ", ".join(f"{f.name}:{f.media_type}:{f.data == PNG}" for f in files)
    return Reply([Text(f"got {said or 'nothing'}")], "done")


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    where = tmp_path / "photo.png"
    where.write_bytes(PNG)
    return where


@pytest.mark.parametrize("mode", ["serve", "in-process"])
async def test_run_with_attach_sends_the_file_either_way(mode, photo):
    provider = ScriptedProvider(_seen)
    files = attached_files([str(photo)], Settings.load)
    out, err = StringIO(), StringIO()
    if mode == "serve":
        async with running_serve(provider):
            assert serve_socket() is not None
            ok = await run_message(
                Settings.load, "what is it", "default", "k", None, False, out, err, files=files
            )
    else:
        ok = await run_once(
            Settings.load(), "what is it", "default", "k", None, False, out, err, provider,
            files=files,
        )  # fmt: skip
    assert ok, err.getvalue()
    assert out.getvalue().strip() == "got photo.png:image/png:True"
    assert provider.requests[0].messages[-1].parts[0] == Text("what is it")


def test_run_a_is_attach_and_repeatable_and_agent_keeps_only_its_long_name(
    monkeypatch, photo, tmp_path
):
    notes = tmp_path / "notes.txt"
    notes.write_text("milk")
    sent: list[tuple[str, str, tuple[File, ...]]] = []

    async def fake(load, text, agent, key, model, ephemeral, **kw):
        sent.append((text, agent, kw["files"]))
        return True

    monkeypatch.setattr(script, "run_message", fake)
    result = CliRunner().invoke(
        app, ["run", "-a", str(photo), "--attach", str(notes), "--agent", "helper", "look"]
    )
    assert result.exit_code == 0, result.output
    (text, agent, files), = sent  # fmt: skip
    assert (text, agent) == ("look", "helper")
    assert [(f.name, f.media_type) for f in files] == [
        ("photo.png", "image/png"),
        ("notes.txt", "text/plain"),
    ]
    help_text = CliRunner().invoke(app, ["run", "--help"]).output
    assert "--attach" in help_text and "-a" in help_text


def test_run_a_of_the_same_file_twice_sends_it_once(tmp_path):
    """As the chat's /attach does: the same name and bytes twice is one attachment (it was sent,
    and counted against the caps, twice)."""
    notes, other = tmp_path / "notes.txt", tmp_path / "other.txt"
    notes.write_text("milk")
    other.write_text("eggs")
    files = attached_files([str(notes), str(other), str(notes)], Settings.load)
    assert [f.name for f in files] == ["notes.txt", "other.txt"]


def test_run_refuses_a_missing_file_and_one_over_the_cap_before_sending(monkeypatch, tmp_path):
    async def fake(*args, **kw):
        raise AssertionError("nothing may be sent")

    monkeypatch.setattr(script, "run_message", fake)
    missing = CliRunner().invoke(app, ["run", "-a", "gone.png", "hi"])
    assert missing.exit_code == 2  # refused before any turn, as every such refusal is
    assert "heron: no file gone.png" in missing.output
    assert f"relative to {os.getcwd()}" in missing.output  # the folder it was read from
    said = CliRunner().invoke(app, ["run", "--json", "-a", "gone.png", "hi"])
    got = json.loads(said.stdout.splitlines()[0])
    assert said.exit_code == 2 and got["ok"] is False and "Nothing was sent" in got["hint"]

    home = Settings.load().paths.home
    (home / "config.toml").write_text("[attachments]\nmax_file_mb = 1\n")
    big = tmp_path / "big.pdf"
    big.write_bytes(b"%PDF-" + b"x" * (1024 * 1024))
    over = CliRunner().invoke(app, ["run", "-a", str(big), "hi"])
    assert over.exit_code == 2
    assert f"heron: {big} is 1.0 MB, over the 1 MB cap per file" in over.output


# ---- heron chat ---------------------------------------------------------------------------------


def test_attach_lists_adds_refuses_and_clears(photo):
    state = terminal.ChatState("k", "default")
    assert terminal.attach_command("", state).startswith("Nothing attached.")
    assert terminal.attach_command(f'"{photo}"', state) == (
        "Attached photo.png (image/png, 72 bytes); it goes with your next message."
    )
    assert terminal.attach_command("", state) == (
        "Attached to your next message:\n  photo.png (image/png, 72 bytes)"
    )
    assert terminal.attach_command(str(photo), state) == (  # twice: sent once
        "photo.png (image/png, 72 bytes) is already attached; it goes once with your next message."
    )
    refused = terminal.attach_command("nope.txt", state)
    assert refused.startswith("heron: no file nope.txt") and len(state.pending) == 1
    assert terminal.attach_command("clear", state) == "Dropped 1 attachment(s)."
    assert state.pending == []


class _Prompt:
    """A PromptSession that types the given lines, then Ctrl-D."""

    def __init__(self, *lines: str) -> None:
        self.lines = list(lines)

    async def prompt_async(self, *args: Any, **kw: Any) -> str:
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)


class _Conn:
    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[File, ...]]] = []

    async def send(self, text: str, key: str, agent: str = "default", files=()) -> None:
        self.sent.append((text, tuple(files)))

    def send_nowait(self, *args: Any) -> None:
        raise AssertionError("no /stop expected")

    def running(self, key: str) -> bool:
        return False

    async def settle(self) -> None:
        return None

    def news(self) -> list[str]:
        return []


async def test_chat_attach_goes_with_the_next_message_only(photo):
    out = io.StringIO()
    state = terminal.ChatState("k", "default")
    view = terminal.TerminalView(Console(file=out, width=100), state)
    conn = _Conn()
    prompt = _Prompt(f"/attach {photo}", "what is this?", "and now?")
    async with AsyncExitStack() as held:
        await terminal._chat(None, conn, state, view, prompt, held)  # type: ignore[arg-type]
    assert [(text, [f.name for f in files]) for text, files in conn.sent] == [
        ("what is this?", ["photo.png"]),
        ("and now?", []),
    ]
    assert "Attached photo.png" in out.getvalue()


async def test_through_serve_the_bytes_go_over_the_socket_and_a_refusal_ends_the_wait():
    """The serve checks the caps again (its config is what counts): a file over them is said,
    nothing is sent to the model, and the client is not left waiting."""
    home = Settings.load().paths.home
    (home / "config.toml").write_text("[attachments]\nmax_file_mb = 1\n")
    provider = ScriptedProvider(_seen)
    got: list[Any] = []

    async def deliver(item: Any) -> None:
        got.append(item)

    big = File("application/pdf", b"%PDF-" + b"x" * (1024 * 1024), "big.pdf")
    async with running_serve(provider):
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", deliver, "k") as conn:
            await conn.send("see", "k", files=(File("image/png", PNG, "photo.png"),))
            await asyncio.wait_for(conn.settle(), 30)
            await conn.send("and this", "k", files=(big,))  # past the client's own check
            await asyncio.wait_for(conn.settle(), 30)
    said = [(i.kind, i.text) for i in got if hasattr(i, "kind") and hasattr(i, "text")]
    assert ("answer", "got photo.png:image/png:True") in said
    errors = [text for kind, text in said if kind == "error"]
    assert any(t.startswith("big.pdf is 1.0 MB, over the 1 MB cap per file") for t in errors)
    assert len(provider.requests) == 1
