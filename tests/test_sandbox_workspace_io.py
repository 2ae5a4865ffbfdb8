"""What a sandboxed command leaves in the workspace (links, FIFOs) cannot make Heron's own,
unconfined process write, read or wait outside it: scripted turns through the engine, the
links made by `bash` in bubblewrap (heron/workspace_io.py)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from sandbox_helpers import CONFIG_KEY, ENV_KEY, seed_home, settings

from heron.agent.engine import Engine
from heron.messages import Reply, Text, ToolCall, ToolResult, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed")


async def turns(
    calls: list[tuple[str, str, dict[str, Any]]], sent: list[ChatRequest] | None = None
) -> list[ToolResult]:
    """One turn of one conversation per (call id, tool, args); the results the model got (and
    every request, into `sent`)."""
    replies = []
    for call_id, name, args in calls:
        replies += [
            Reply([ToolCall(call_id, name, args)], "tool", Usage(10, 5)),
            Reply([Text("done")], "done", Usage(20, 5)),
        ]
    provider = ScriptedProvider(replies)
    async with Engine.open(settings(confined=True), provider=provider) as engine:
        for _ in calls:
            await engine.turn("attack", "go")
    if sent is not None:
        sent += provider.requests
    out = []
    for request in provider.requests[1::2]:
        out += [p for p in request.messages[-1].parts if isinstance(p, ToolResult)]
    return out


# Over the result's budget, so saved: 200 matches of 300 characters (bash's own output is
# cut to the budget by the tool, head and tail, and never saved).
MAKE = {"command": "yes $(printf 'PWNED-LINE%.0s' {1..30}) | head -n 4000 > pwned.txt"}
LONG = {"pattern": "PWNED", "path": "pwned.txt"}


async def test_links_planted_by_a_command_do_not_carry_a_saved_result_out(
    heron_home: Path, tmp_path: Path
) -> None:
    out = tmp_path / "outside"
    out.mkdir()
    plant = f"cd .heron/results && for f in c1-*; do rm $f && ln -s {out}/bash_profile $f; done"
    _, first, _, again = await turns(
        [
            ("c0", "bash", MAKE),
            ("c1", "grep", LONG),
            ("c2", "bash", {"command": plant}),
            ("c1", "grep", LONG),
        ]
    )
    assert ".heron/results/c1-" in first.content and first.content == again.content
    saved = next((heron_home / "workspace/.heron/results").glob("c1-*.txt"))
    assert not saved.is_symlink() and "PWNED-LINE" in saved.read_text()
    assert list(out.iterdir()) == []  # nothing written through the link
    # A folder swapped for a link by a command: nothing lands where it points either.
    swap = {"command": f"rm -rf .heron/results && ln -s {out} .heron/results"}
    await turns([("c3", "bash", swap), ("c4", "grep", LONG)])
    assert (heron_home / "workspace/.heron/results").is_symlink()
    assert list(out.iterdir()) == []


def stored(home: Path) -> bytes:
    """Every byte of the database, its WAL included."""
    return b"".join(p.read_bytes() for p in home.glob("heron.db*"))


async def test_bootstrap_links_put_no_key_or_file_outside_into_the_prompt(
    heron_home: Path,
) -> None:
    seed_home(heron_home)
    plant = (
        "ln -sf ../config.toml USER.md; ln -sf /proc/self/environ SOUL.md;"
        " ln -sf ../memory/personal/always/x.md AGENTS.md"
    )
    sent: list[ChatRequest] = []
    await turns([("c1", "bash", {"command": plant}), ("c2", "bash", {"command": "true"})], sent)
    assert (heron_home / "workspace/USER.md").is_symlink()  # planted, then not followed
    for request in sent:  # (the memory entry is in the prompt's Memory section, as always)
        assert "# Workspace files" not in request.system
        for secret in (CONFIG_KEY, ENV_KEY, "api_key", "PATH="):
            assert secret not in request.system
    for secret in (CONFIG_KEY, ENV_KEY):
        assert secret.encode() not in stored(heron_home)


async def test_a_key_written_into_a_bootstrap_file_is_redacted(heron_home: Path) -> None:
    seed_home(heron_home)
    (heron_home / "workspace").mkdir(exist_ok=True)
    (heron_home / "workspace/USER.md").write_text(f"My keys: {CONFIG_KEY} and {ENV_KEY}.\n")
    sent: list[ChatRequest] = []
    await turns([("c1", "bash", {"command": "true"})], sent)
    assert "My keys: [redacted: configured key] and [redacted: configured key]." in sent[0].system
    for secret in (CONFIG_KEY, ENV_KEY):
        assert all(secret not in request.system for request in sent)
        assert secret.encode() not in stored(heron_home)


async def test_fifos_and_huge_files_answer_at_once(heron_home: Path) -> None:
    """A FIFO a command made is refused by every file tool (it would block a thread for ever,
    and with it the serve's API and its exit); a sparse file is judged on its first bytes, and
    a large text file is read up to MAX_READ."""
    make = (
        "mkfifo pipe && mkdir d && mkfifo d/pipe && echo 'findme' > d/plain.txt"
        " && truncate -s 1500M sparse.bin && yes 'a line of text' | head -c 12000000 > big.txt"
    )
    calls = [
        ("c1", "bash", {"command": make}),
        ("c2", "read_file", {"path": "pipe"}),
        ("c3", "write_file", {"path": "pipe", "content": "x"}),
        ("c4", "edit_file", {"path": "pipe", "old": "a", "new": "b"}),
        ("c5", "grep", {"pattern": "findme", "path": "d"}),
        ("c6", "read_file", {"path": "sparse.bin"}),
        ("c7", "read_file", {"path": "big.txt", "offset": 5, "limit": 2}),
        ("c8", "edit_file", {"path": "big.txt", "old": "a line", "new": "b", "replace_all": True}),
    ]
    got = await asyncio.wait_for(turns(calls), 300)  # a hang fails here instead of for ever
    fifo = got[1:4]
    assert all(r.is_error and "not a regular file" in r.content for r in fifo), fifo
    assert got[4].content == "d/plain.txt:1:findme"
    assert got[5].is_error and "binary file (1572864000 bytes)" in got[5].content
    assert got[6].content.startswith("5\ta line of text\n6\ta line of text\n[lines 5-6 of ")
    assert got[7].is_error and "too large to edit" in got[7].content
    assert (heron_home / "workspace/big.txt").stat().st_size == 12_000_000  # untouched


async def test_the_kernel_starts_whatever_stands_at_its_log(heron_home: Path) -> None:
    """A folder at `.heron/kernel.log`, or a file at `.heron`, does not turn run_cell off: the
    kernel's log goes to Heron's private folder for that kernel instead, and what the command
    made is left as it was."""
    workspace = heron_home / "workspace"
    cell = ("c2", "run_cell", {"code": "print('CELL', 6 * 7)"})
    for plant in ("mkdir -p .heron/kernel.log/sub", "rm -rf .heron && echo x > .heron"):
        made, ran = await turns([("c1", "bash", {"command": plant}), cell])
        assert not made.is_error, made.content
        assert not ran.is_error and "CELL 42" in ran.content, ran.content
    assert (workspace / ".heron").read_text() == "x\n"
