from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from heron.messages import ToolCall
from heron.saved import read_whole
from heron.tools.context import ToolContext, TurnServices
from heron.tools.registry import ToolRegistry
from heron.tools.sandbox import Sandbox
from heron.tools.shell import HeadTail, bash


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path, result_budget=2000)


@pytest.fixture
def bare(tmp_path: Path) -> ToolContext:
    """Unconfined: host pids a test can check (in the sandbox the command's pids are those of
    its own pid namespace; tests/test_sandbox_kill.py)."""
    return ToolContext(tmp_path, result_budget=2000, sandbox=Sandbox(tmp_path, bwrap=None))


class Raw(Sandbox):
    """bash with nothing around it: the tool's own process-group and output handling, which
    stay as a safety net under the sandbox and the runner."""

    def wrap(self, argv, *, shown=(), seccomp=None):
        return list(argv)


@pytest.fixture
def raw(tmp_path: Path) -> ToolContext:
    return ToolContext(tmp_path, result_budget=2000, sandbox=Raw(tmp_path, bwrap=None))


async def run(ctx: ToolContext, command: str, timeout: int = 120):
    args = {"command": command, "timeout": timeout}
    return await ToolRegistry([bash]).call(ToolCall("c1", "bash", args), ctx)


async def test_runs_in_the_workspace_with_exit_code(ctx: ToolContext) -> None:
    result = await run(ctx, "pwd; echo out; echo err >&2")
    assert not result.is_error
    assert result.content == f"{ctx.workspace.resolve()}\nout\nerr\n[exit code 0]"
    assert ctx.effects == [{"kind": "command", "command": "pwd; echo out; echo err >&2", "exit": 0}]


async def test_non_zero_exit_is_an_error(ctx: ToolContext) -> None:
    result = await run(ctx, "echo nope; exit 3")
    assert result.is_error
    assert result.content == "nope\n[exit code 3]"
    assert ctx.effects[-1]["exit"] == 3


async def test_no_output(ctx: ToolContext) -> None:
    result = await run(ctx, "true")
    assert result.content == "(no output)\n[exit code 0]"


@pytest.mark.parametrize("confined", [True, False])
async def test_the_environment_is_the_allowlist(tmp_path: Path, confined: bool) -> None:
    sandbox = Sandbox(tmp_path, bwrap="bwrap" if confined else None)
    ctx = ToolContext(tmp_path, sandbox=sandbox)
    result = await run(ctx, "env | cut -d= -f1 | sort | tr '\\n' ' '")
    names = set(result.content.split("\n")[0].split())
    assert names - {"PWD", "SHLVL", "_", "OLDPWD"} == {"PATH", "HOME", "LANG", "TERM"}


async def test_timeout_kills_the_process_group(bare: ToolContext) -> None:
    ctx = bare
    # A grandchild in the background would outlive a kill of bash alone.
    pidfile = ctx.workspace / "child.pid"
    command = f"sleep 30 & echo $! > {pidfile}; echo started; wait"
    result = await run(ctx, command, timeout=1)
    assert result.is_error
    assert "started" in result.content
    assert "timed out after 1 s" in result.content
    assert ctx.effects[-1]["exit"] is None
    child = int(pidfile.read_text())
    assert _gone(child)


async def test_cancelling_the_call_kills_the_process_group(bare: ToolContext) -> None:
    ctx = bare
    pidfile = ctx.workspace / "child.pid"
    task = asyncio.create_task(run(ctx, f"sleep 30 & echo $! > {pidfile}; wait"))
    while not pidfile.exists() or not pidfile.read_text().strip():
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _gone(int(pidfile.read_text()))


def _gone(pid: int, bound: float = 10.0) -> bool:
    """Whether `pid` ends, polled: a kill takes effect when the machine gets to it (the bound
    only keeps a broken test from hanging)."""
    deadline = time.monotonic() + bound
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes: check its state.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


async def test_background_child_holding_the_output_does_not_hang_the_call(
    raw: ToolContext,
) -> None:
    ctx = raw
    result = await run(ctx, "sleep 30 & echo quick")
    assert result.content.startswith("quick")
    assert "background processes still writing to the output were stopped" in result.content
    assert result.content.endswith("[exit code 0]")


async def test_raw_background_child_with_its_own_output_survives(raw: ToolContext) -> None:
    ctx = raw
    pidfile = ctx.workspace / "child.pid"
    result = await run(ctx, f"sleep 30 > /dev/null 2>&1 & echo $! > {pidfile}; echo ok")
    assert result.content == "ok\n[exit code 0]"
    child = int(pidfile.read_text())
    assert _alive(child)
    os.kill(child, 9)


async def test_output_is_capped_head_and_tail(ctx: ToolContext) -> None:
    result = await run(ctx, "echo FIRST; for i in $(seq 1 20000); do echo line$i; done; echo LAST")
    assert not result.is_error
    assert result.content.startswith("FIRST\n")
    assert result.content.endswith("LAST\n[exit code 0]")
    assert "characters omitted ...]" in result.content
    assert len(result.content) <= ctx.result_budget
    assert not (ctx.workspace / ".heron" / "results").exists()  # capped, never spilled


async def test_the_person_keeps_the_whole_output_the_model_reads_as_head_and_tail(tmp_path: Path):
    home = tmp_path / "home"
    ctx = ToolContext(tmp_path / "ws", result_budget=2000, services=TurnServices(home=home))
    ctx.workspace.mkdir()
    result = await run(ctx, "seq 1 5000")
    assert "characters omitted ...]" in result.content and len(result.content) <= 2000
    whole = read_whole(home, result)
    assert whole == "\n".join(str(n) for n in range(1, 5001)) + "\n[exit code 0]"
    assert not home.joinpath("outputs").is_relative_to(ctx.workspace)  # no tool reaches it
    small = await run(ctx, "echo short")  # nothing cut: nothing kept beside the result
    assert read_whole(home, small) is None


def test_the_whole_output_is_capped_and_says_so() -> None:
    sink = HeadTail(20, ": kept 20")
    for piece in ["0123456789", "abcdefghij", "ABCDEFGHIJ", "klmnopqrst"]:
        sink.add(piece)
    assert sink.text() == "0123456789\n[... 20 characters omitted: kept 20 ...]\nklmnopqrst"
    assert sink.text(10) == "01234\n[... 30 characters omitted ...]\npqrst"  # the model's
    fits = HeadTail(100)
    fits.add("0123456789" * 3)
    assert fits.text(10) == "01234\n[... 20 characters omitted ...]\n56789"  # tail in head


def test_head_tail_counts_what_it_drops() -> None:
    sink = HeadTail(10)
    for piece in ["abc", "defgh", "ijklmnop", "qrst"]:
        sink.add(piece)
    assert sink.text() == "abcde\n[... 10 characters omitted ...]\npqrst"
    small = HeadTail(10)
    small.add("short")
    assert small.text() == "short"


async def test_a_missing_bwrap_is_said_not_crashed(tmp_path: Path) -> None:
    ctx = ToolContext(tmp_path, sandbox=Sandbox(tmp_path, bwrap=str(tmp_path / "no-bwrap")))
    result = await run(ctx, "echo hi")
    assert result.is_error and "no-bwrap is missing" in result.content
    assert "install it (apt-get install bubblewrap)" in result.content


@pytest.mark.parametrize("detach", ["", "setsid "], ids=["background", "own-session"])
async def test_unconfined_what_a_command_leaves_ends_with_it(
    bare: ToolContext, detach: str
) -> None:
    """The runner is a subreaper: even a process detached with setsid is reparented to it and
    killed when the command ends, as the sandbox's pid namespace does."""
    pidfile = bare.workspace / "child.pid"
    command = f"{detach}sleep 30 > /dev/null 2>&1 & echo $! > {pidfile}; echo ok"
    result = await run(bare, command)
    assert result.content == "ok\n[exit code 0]"
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not _alive(child)


async def test_binary_output_is_not_sent_to_the_model(ctx: ToolContext) -> None:
    """Bytes that are not text (U+FFFD, NUL, control characters) are counted, not sent: the
    text printed before and after them is kept (the bug: 3,000 random bytes went as they were)."""
    noise = r"head -c 3000 /dev/zero | tr '\000' '\201'; head -c 1000 /dev/zero"
    result = await run(ctx, f"echo compiling; {noise}; printf '\\ndone\\n'")
    assert result.content == (
        "compiling\n[binary output: 4,001 bytes that are not text, not shown; redirect it to a "
        "file (command > out.bin) and look at it with xxd or file]\ndone\n[exit code 0]"
    )
    every_byte = r"s=$(for i in $(seq 0 255); do printf '\\x%02x' $i; done); printf '%b' $s $s $s"
    alone = await run(ctx, every_byte)
    assert alone.content.startswith("[binary output: 768 bytes that are not text, not shown")
    assert alone.content.endswith("[exit code 0]") and len(alone.content) < 300


async def test_text_with_colours_and_tabs_is_text(ctx: ToolContext) -> None:
    result = await run(ctx, r"printf '\033[31mred\033[0m\tcol\n'; printf 'caf\xc3\xa9\n'")
    assert result.content == "\x1b[31mred\x1b[0m\tcol\ncafé\n[exit code 0]"
