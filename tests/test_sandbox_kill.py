"""Nothing a command starts outlives Heron: a Heron process whose model asked for a `sleep`
(in the background, in its own session, or from the kernel) is SIGKILLed, and the sleep goes
with it: sandboxed (bwrap's pid namespace) and unconfined (the runner, heron/tools/runner.py).
The deadline is generous on purpose; bench/overhead.py measures the real figure."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sandbox_helpers import child_env

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed"),
    pytest.mark.slow,  # Heron in a process of its own, killed with SIGKILL
]

DEADLINE = 10.0  # seconds; a loaded machine, not a target

CHILD = """\
import asyncio, sys
from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider

tool, args = sys.argv[1], eval(sys.argv[2])
provider = ScriptedProvider([
    Reply([ToolCall("c1", tool, args)], "tool", Usage(1, 1)),
    Reply([Text("done")], "done", Usage(1, 1)),
])

async def main():
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("k", "start a sleep")

asyncio.run(main())
"""


def sleeps(duration: str) -> list[int]:
    """Host pids of `sleep <duration>` processes (zombies are dead)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv[:2] == [b"sleep", duration.encode()] and state != "Z":
            found.append(int(entry.name))
    return found


def wait_for(check, deadline: float) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()


def commands(duration: str) -> list[tuple[str, dict[str, str]]]:
    return [
        ("bash", {"command": f"sleep {duration} & wait"}),
        ("bash", {"command": f"setsid nohup sleep {duration} > /dev/null 2>&1 & sleep 1000"}),
        (
            "run_cell",
            {
                "code": textwrap.dedent(f"""\
                    import subprocess, time
                    subprocess.Popen(['sleep', '{duration}'], start_new_session=True)
                    time.sleep(1000)""")
            },
        ),
    ]


@pytest.mark.parametrize("confined", [True, False], ids=["sandboxed", "unconfined"])
@pytest.mark.parametrize("case", [0, 1, 2], ids=["background", "own-session", "kernel"])
def test_a_sleep_started_by_a_tool_dies_with_heron(
    tmp_path: Path, heron_home: Path, case: int, confined: bool
) -> None:
    duration = f"100.{random.randrange(10**6):06d}"
    tool, args = commands(duration)[case]
    script = tmp_path / "heron_child.py"
    script.write_text(CHILD)
    env = child_env(heron_home, confined)
    child = subprocess.Popen(
        [sys.executable, str(script), tool, repr(args)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_for(lambda: sleeps(duration), 60), "the sleep never started"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert wait_for(lambda: not sleeps(duration), DEADLINE), sleeps(duration)
    finally:
        if child.poll() is None:
            child.kill()
        for pid in sleeps(duration):
            os.kill(pid, signal.SIGKILL)


def test_a_killed_herons_kernel_sockets_are_swept(tmp_path: Path) -> None:
    from heron.tools.python_kernel import SOCKETS_PREFIX, sweep_sockets

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{SOCKETS_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{SOCKETS_PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{SOCKETS_PREFIX}oddname"
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "k-1").write_text("")
    assert sweep_sockets(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()
