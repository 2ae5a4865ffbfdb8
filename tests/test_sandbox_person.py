"""Accepting, rejecting, forgetting, deleting and logging a browser in are the person's acts:
the CLI refuses them when a Heron tool started it, from bash and from run_cell, sandboxed and
unconfined. The commands name the real HERON_HOME, as an attacker who read it in the prompt
would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_helpers import call_tool, seed_home

from heron.memory import EntryPath, MemoryService
from heron.store import Store

pytestmark = pytest.mark.slow  # the real CLI, run from inside the tools

REFUSED = "the person's act; run it in your own terminal"


def _setup(home: Path) -> dict[str, object]:
    """Two waiting suggestions, one kept entry, one other conversation."""
    store = Store(home / "heron.db")
    try:
        service = MemoryService(home / "memory", store)
        path = EntryPath("personal", "when", "t", "kept")
        service.accept(service.suggest_lesson(path, "Kept rule", "m"), env={})
        to_accept = service.suggest_lesson(EntryPath("personal", "when", "t", "a"), "Rule A", "m")
        to_reject = service.suggest_lesson(EntryPath("personal", "when", "t", "r"), "Rule R", "m")
        store.open_conversation("other")
    finally:
        store.close()
    return {"accept": to_accept, "reject": to_reject, "forget": path.rel}


def _acts(targets: dict[str, object]) -> list[list[str]]:
    return [
        ["memory", "accept", str(targets["accept"])],
        ["memory", "reject", str(targets["reject"])],
        ["memory", "forget", str(targets["forget"])],
        ["conversations", "delete", "other", "--yes"],
        ["web"],  # a login address for the web UI, which can do all of the above
    ]


def _bash(home: Path, acts: list[list[str]]) -> dict[str, str]:
    lines = [f"export HERON_HOME={home}"]
    for act in acts:
        lines.append(f"{sys.executable} -m heron {' '.join(act)}; echo rc=$?")
    # exec in place of the shell: the mark is on a process the command does not own.
    lines.append(f"(exec {sys.executable} -m heron {' '.join(acts[0])}); echo rc=$?")
    # Detached (setsid and a double fork): reparented to the runner or bwrap, not to init.
    inner = f"{sys.executable} -m heron {' '.join(acts[0])} > out 2>&1; echo rc=$? >> out"
    lines.append(f"(setsid sh -c '{inner}' &)")
    lines.append("until grep -q rc= out 2>/dev/null; do sleep 0.1; done; cat out")
    return {"command": "\n".join(lines)}


def _cell(home: Path, acts: list[list[str]]) -> dict[str, str]:
    code = f"""\
import os, subprocess, sys
os.environ['HERON_HOME'] = {str(home)!r}
os.environ.pop('HERON_AGENT_COMMAND', None)
for act in {acts!r}:
    done = subprocess.run([sys.executable, '-m', 'heron', *act], capture_output=True, text=True)
    print(done.stdout, done.stderr, 'rc=%d' % done.returncode)
"""
    return {"code": code}


def _state(home: Path) -> tuple[int, list[str], bool]:
    store = Store(home / "heron.db")
    try:
        service = MemoryService(home / "memory", store)
        return (
            service.count_waiting(),
            [e.path.rel for e in service.entries()],
            store.conversation("other") is not None,
        )
    finally:
        store.close()


@pytest.mark.parametrize("confined", [True, False], ids=["sandboxed", "unconfined"])
@pytest.mark.parametrize("tool", ["bash", "run_cell"])
async def test_person_only_acts_fail_from_a_tool(heron_home: Path, tool: str, confined: bool):
    seed_home(heron_home, 'approval = "allow"')
    targets = _setup(heron_home)
    before = _state(heron_home)
    acts = _acts(targets)
    args = _bash(heron_home, acts) if tool == "bash" else _cell(heron_home, acts)
    result = await call_tool(tool, args, confined=confined)
    out = result.content
    tries = len(acts) + (2 if tool == "bash" else 0)
    assert out.count(REFUSED) == tries, out
    assert out.count("rc=1") == tries
    assert _state(heron_home) == before
    assert before[0] == 2 and targets["forget"] in before[1] and before[2]
    # The same command in the person's own terminal does it: the refusal was the guard's.
    env = {**os.environ, "HERON_HOME": str(heron_home)}
    done = subprocess.run(
        [sys.executable, "-m", "heron", *acts[0]], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert _state(heron_home)[0] == 1


def test_the_chain_walk_finds_the_mark_and_only_the_mark(tmp_path: Path) -> None:
    """tool_ancestor over a fake /proc: the marked wrapper is found at any depth; a chain
    without it (the person's terminal) is not refused."""
    from heron.tools.person import tool_ancestor

    def proc(pid: int, ppid: int, *argv: str) -> None:
        folder = tmp_path / str(pid)
        folder.mkdir()
        (folder / "status").write_text(f"Name:\tx\nPPid:\t{ppid}\n")
        (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")

    proc(1, 0, "/sbin/init")
    proc(10, 1, "/bin/bash", "-c", '"$@"; exit $?', "heron-tool-runner", "/bin/bash")
    proc(11, 10, "/bin/bash", "-c", "x")
    proc(12, 11, "python", "-m", "heron", "memory", "accept", "1")
    proc(20, 1, "bash")
    proc(21, 20, "python", "-m", "heron", "memory", "accept", "1")
    proc(30, 1, "bwrap", "--dir", "/tmp/heron-tool-runner", "--", "/bin/bash")
    proc(31, 30, "python")
    assert tool_ancestor(12, tmp_path) == 10
    assert tool_ancestor(21, tmp_path) is None
    assert tool_ancestor(31, tmp_path) == 30
