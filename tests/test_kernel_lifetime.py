"""How long run_cell's kernel lives (QA16b defect 3): in a long-lived process one kernel per
conversation, kept between its turns, ended when unused for `[tools] kernel_idle_minutes`, on
/new and with the process, however the process ends; a one-shot `heron run` says its kernel
ends with the turn. Real kernels through the sandbox launcher, driven by the scripted model."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_helpers import child_env

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.tools.python_kernel import KernelSession, lifetime_in

pytestmark = pytest.mark.slow  # real Jupyter kernels

DEADLINE = 15.0  # seconds for a kernel to go; a loaded machine, not a target


def cell(call_id: str, code: str) -> list[Reply]:
    """A turn whose model runs one cell, then says it is done."""
    return [
        Reply([ToolCall(call_id, "run_cell", {"code": code})], "tool", Usage(1, 1)),
        Reply([Text("done")], "done", Usage(1, 1)),
    ]


def results(engine: Engine) -> dict[str, str]:
    rows = engine.store.query("SELECT call_id, result FROM tool_calls ORDER BY id")
    return {row["call_id"]: row["result"] for row in rows}


def kernel_processes(sockets: Path) -> list[int]:
    """Live processes started for the kernel whose socket folder is `sockets` (bwrap or the
    runner, and the kernel: each names its connection file there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(sockets).encode() in argv and state != "Z":
            found.append(int(entry.name))
    return found


def sockets_of(engine: Engine, key: str) -> Path:
    session = engine.kernels.take(key)
    engine.kernels._runs.pop(key)  # only looked at, not used by a run
    assert isinstance(session, KernelSession) and session._sockets is not None
    return session._sockets


async def gone(sockets: Path) -> bool:
    end = time.monotonic() + DEADLINE
    while kernel_processes(sockets) and time.monotonic() < end:
        await asyncio.sleep(0.1)
    return not kernel_processes(sockets)


async def test_variables_survive_between_turns_until_new() -> None:
    provider = ScriptedProvider(
        [
            *cell("c1", "y = 7; print(y)"),
            *cell("c2", "'x' * 50000"),
            *cell("c3", "print(y * 2, len(_heron_values[2]))"),
            *cell("o1", "print(y)"),  # another conversation: a kernel of its own
            Reply([Text("fresh")], "done", Usage(1, 1)),  # after /new
            *cell("c4", "print('y' in globals())"),
        ]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("ks", "set y")
        await engine.turn("ks", "make a big value")
        await engine.turn("ks", "use both")
        await engine.turn("other", "read y")
        assert sorted(engine.kernels.running) == ["ks", "other"]
        sockets = sockets_of(engine, "ks")
        await engine.turn("ks", "/new")
        assert await gone(sockets), "/new left the conversation's kernel running"
        await engine.turn("ks", "y again")
        said = results(engine)
        others = sockets_of(engine, "other")
    assert said["c1"] == "[1] 7"
    assert "`_heron_values[2]`" in said["c2"]
    assert said["c3"] == "[1] 14 50000"  # the next turn: same kernel, value and stash kept
    assert "NameError" in said["o1"]
    assert said["c4"] == "[1] False"  # after /new: empty, and no notice (a fresh start)
    assert await gone(others), "a kernel outlived the engine"
    provider.assert_complete()


async def test_an_unused_kernel_ends_and_the_next_cell_is_told(heron_home: Path) -> None:
    (heron_home / "config.toml").write_text("[tools]\nkernel_idle_minutes = 0.005\n")
    provider = ScriptedProvider([*cell("c1", "z = 1"), *cell("c2", "print(z)")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("idle", "set z")
        assert await gone(sockets_of(engine, "idle")), "the unused kernel was kept"
        assert engine.kernels.running == []
        await engine.turn("idle", "read z")
        said = results(engine)
    assert said["c2"].startswith(
        "This cell ran in a new kernel (the last one ended after 0.005 minutes unused): "
        "earlier variables are gone."
    )
    assert "NameError" in said["c2"]


async def test_past_the_most_kept_the_least_recently_used_kernel_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("heron.tools.python_kernel.KEPT_MAX", 1)
    provider = ScriptedProvider(
        [*cell("a1", "a = 1"), *cell("b1", "b = 2"), *cell("a2", "print(a)")]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("a", "set a")
        first = sockets_of(engine, "a")
        await engine.turn("b", "set b")
        assert await gone(first) and engine.kernels.running == ["b"]
        await engine.turn("a", "read a")
        said = results(engine)
    assert said["a2"].startswith(
        "This cell ran in a new kernel (this process keeps at most 1; it was used least recently): "
    )


async def test_the_description_says_how_long_variables_last(heron_home: Path) -> None:
    async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
        kept = engine.registry.get("run_cell")
    async with Engine.open(Settings.load(), provider=ScriptedProvider([]), one_shot=True) as one:
        once = one.registry.get("run_cell")
    assert kept is not None and once is not None
    assert "kept for this conversation's later turns until it has been unused for 30 " in (
        kept.description
    )
    assert "the kernel ends with this turn, and a later message starts an empty one" in (
        once.description
    )
    assert kept.description.endswith(one.sandbox.describe())  # still said last, once
    assert kept.description.count(one.sandbox.describe()) == 1
    # What a replay reads back to describe the kernel as the recorded process did.
    assert lifetime_in(kept.description) == (30.0, False)
    assert lifetime_in(once.description) == (0.0, True)


CHILD = """\
import asyncio, sys
from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider

provider = ScriptedProvider([
    Reply([ToolCall("c1", "run_cell", {"code": "kept = 1"})], "tool", Usage(1, 1)),
    Reply([Text("done")], "done", Usage(1, 1)),
])

async def main():
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("k", "start a kernel")
        print(engine.kernels._sessions["k"]._sockets, flush=True)
        await asyncio.sleep(600)  # between turns: the kernel is kept

asyncio.run(main())
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed")
@pytest.mark.parametrize("confined", [True, False], ids=["sandboxed", "unconfined"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_a_kept_kernel_dies_with_its_process(
    tmp_path: Path, heron_home: Path, confined: bool, sig: signal.Signals
) -> None:
    script = tmp_path / "heron_child.py"
    script.write_text(CHILD)
    env = child_env(heron_home, confined)
    child = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
    )
    sockets = None
    try:
        assert child.stdout is not None
        sockets = Path(child.stdout.readline().strip())
        assert kernel_processes(sockets), "the kept kernel is not running"
        child.send_signal(sig)
        child.wait(10)
        assert asyncio.run(gone(sockets)), kernel_processes(sockets)
    finally:
        if child.poll() is None:
            child.kill()
        for pid in kernel_processes(sockets) if sockets else []:
            os.kill(pid, signal.SIGKILL)
