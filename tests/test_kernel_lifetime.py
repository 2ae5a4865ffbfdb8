"""How long run_cell's kernel lives (QA16b defect 3): in a long-lived process one kernel per
conversation, kept between its turns, ended when unused for `[tools] kernel_idle_minutes`, on
/new and with the process, however the process ends; a one-shot `heron run`'s first cell says
its kernel ends with the turn (run_cell's description is the same in every process). Real
kernels through the sandbox launcher, driven by the scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_helpers import child_env
from serve_helpers import running_serve, ws_client, ws_hello, ws_next, ws_until

from heron.agent.engine import Engine
from heron.channels.info import remove_conversation
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.tools.python_kernel import (
    ONE_SHOT_KERNEL,
    SOCKETS_PREFIX,
    KernelKey,
    KernelSession,
    lifetime_in,
)

pytestmark = pytest.mark.slow  # real Jupyter kernels

DEADLINE = 15.0  # seconds for a kernel to go; a loaded machine, not a target


def cell(call_id: str, code: str) -> list[Reply]:
    """A turn whose model runs one cell, then says it is done."""
    return [
        Reply([ToolCall(call_id, "run_cell", {"code": code})], "tool", Usage(1, 1)),
        Reply([Text("done")], "done", Usage(1, 1)),
    ]


def told_new_kernel(result: str, why: str) -> bool:
    """Whether a cell's result starts by telling the model its kernel is new, and why."""
    return result.startswith(f"This cell ran in a new kernel ({why}): earlier variables are gone.")


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


def owner(engine: Engine, key: str) -> KernelKey:
    conversation = engine.store.conversation(key)
    assert conversation is not None
    return KernelKey.of(conversation)


def running(engine: Engine) -> list[str]:
    """The keys of the conversations whose kernel runs now."""
    ids = {c.id: c.key for c in engine.store.conversations(internal=True)}
    return sorted(ids[k.conversation_id] for k in engine.kernels.running)


def sockets_of(engine: Engine, key: str) -> Path:
    kept = owner(engine, key)
    session = engine.kernels.take(kept)
    engine.kernels._runs.pop(kept)  # only looked at, not used by a run
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
        assert running(engine) == ["ks", "other"]
        sockets = sockets_of(engine, "ks")
        await engine.turn("ks", "/new")
        # /new's memory review asks the model in the background ("fresh"): it has its reply
        # before the next turn asks for its own (a scripted model answers in order).
        await engine.settle_background()
        assert await gone(sockets), "/new left the conversation's kernel running"
        await engine.turn("ks", "y again")
        said = results(engine)
        others = sockets_of(engine, "other")
    assert said["c1"] == "[1] 7"
    assert "`_heron_values[2]`" in said["c2"]
    # The next turn: same kernel, value and stash kept, and the output labelled with the
    # kernel's own count (its 3rd cell), as the stash and a traceback's `Cell In[3]` are.
    assert said["c3"] == "[3] 14 50000"
    assert "NameError" in said["o1"] and "new kernel" not in said["o1"]  # never ran a cell
    assert said["c4"] == "[1] False"  # after /new: empty, and no notice (a fresh start)
    assert await gone(others), "a kernel outlived the engine"
    provider.assert_complete()


async def test_a_deleted_conversations_kernel_never_serves_a_new_one_of_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QA16c B1: `heron conversations delete` beside a serve (another process: the serve's
    kernel is not told), then a new conversation of the same key: it starts empty."""
    asked: list[int] = []
    used_tool = Store.used_tool

    def counted(store: Store, conversation_id: int, tool: str) -> bool:
        asked.append(conversation_id)
        return used_tool(store, conversation_id, tool)

    monkeypatch.setattr(Store, "used_tool", counted)
    monkeypatch.setattr("heron.tools.python_kernel.REAP_EVERY", 0.1)
    provider = ScriptedProvider(
        [
            *cell("d1", "secret = 'card 4111'; print('set')"),
            *cell("d2", "print(secret)"),
            *cell("d3", "print(secret)"),
        ]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("dk", "set it")
        await engine.turn("dk", "read it")  # a kept kernel: not asked about earlier cells
        deleted, said = owner(engine, "dk"), results(engine)
        sockets = sockets_of(engine, "dk")
        elsewhere = Store(Settings.load().database)  # the CLI's own connection
        remove_conversation(elsewhere, "dk")
        elsewhere.close()
        # The reaper's next look finds the conversation gone and ends its kernel.
        assert await gone(sockets), "the deleted conversation's kernel still runs"
        await engine.turn("dk", "read it again")
        reborn = owner(engine, "dk")
        said.update(results(engine))
    assert said["d1"] == "[1] set" and said["d2"] == "[2] card 4111"
    # SQLite gave the new row the deleted one's id: the id alone would not tell them apart.
    assert reborn.conversation_id == deleted.conversation_id and reborn != deleted
    assert "NameError" in said["d3"] and "card 4111" not in said["d3"]
    assert "new kernel" not in said["d3"]  # a new conversation: nothing to be told
    assert asked == [deleted.conversation_id] * 2  # one query per new kernel, none after


async def test_a_cell_in_a_later_process_is_told_its_kernel_is_new() -> None:
    """A serve restarted, or a one-shot `heron run` per message: the conversation's next
    cell runs in a new kernel, and the model, which saw the earlier cells, is told so."""
    before = ScriptedProvider([*cell("p1", "kept = 1")])
    async with Engine.open(Settings.load(), provider=before, one_shot=True) as engine:
        await engine.turn("pk", "set kept")
    after = ScriptedProvider(
        [
            *cell("p2", "print(kept)"),
            Reply([Text("fresh")], "done", Usage(1, 1)),  # /new
        ]
    )
    async with Engine.open(Settings.load(), provider=after, one_shot=True) as engine:
        await engine.turn("pk", "read kept")
        await engine.turn("pk", "/new")
    last = ScriptedProvider([*cell("p3", "print('kept' in globals())")])
    async with Engine.open(Settings.load(), provider=last, one_shot=True) as engine:
        await engine.turn("pk", "read kept after /new")
        said = results(engine)
    why = "the kernel of this conversation's earlier cells ended with the process that ran them"
    assert told_new_kernel(said["p2"], why) and "NameError" in said["p2"]
    # after /new the model expects nothing: no notice but the one-shot kernel's own
    assert said["p3"] == f"[1] False\n{ONE_SHOT_KERNEL}"


async def test_an_unused_kernel_ends_and_the_next_cell_is_told(heron_home: Path) -> None:
    (heron_home / "config.toml").write_text("[tools]\nkernel_idle_minutes = 0.005\n")
    provider = ScriptedProvider([*cell("c1", "z = 1"), *cell("c2", "print(z)")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("idle", "set z")
        assert await gone(sockets_of(engine, "idle")), "the unused kernel was kept"
        assert running(engine) == []
        await engine.turn("idle", "read z")
        said = results(engine)
    assert told_new_kernel(said["c2"], "the last one ended after 0.005 minutes unused")
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
        assert await gone(first) and running(engine) == ["b"]
        await engine.turn("a", "read a")
        said = results(engine)
    assert said["a2"].startswith(
        "This cell ran in a new kernel (this process keeps at most 1; it was used least recently): "
    )


async def test_the_description_says_how_long_variables_last(heron_home: Path) -> None:
    """run_cell's description is the same in a one-shot `heron run` as in a chat or a serve
    (tools come first in the cached prefix: a switch between them used to miss the whole
    cache); the one-shot run's first cell, and only it, says its variables end with the turn."""
    async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
        kept = engine.registry.get("run_cell")
        chat_specs = engine.registry.specs()
    cells = ScriptedProvider([*cell("o1", "v = 1"), *cell("o2", "print(v)")])
    async with Engine.open(Settings.load(), provider=cells, one_shot=True) as one:
        once = one.registry.get("run_cell")
        run_specs = one.registry.specs()
        await one.turn("once", "set v")
        await one.turn("once", "read v")  # a second turn in the same process: no kernel kept
        said = results(one)
    assert kept is not None and once is not None
    assert run_specs == chat_specs
    assert "kept for this conversation's later turns until it has been unused for 30 " in (
        kept.description
    )
    assert "answers one message" not in once.description
    assert kept.description.endswith(one.sandbox.describe())  # still said last, once
    assert kept.description.count(one.sandbox.describe()) == 1
    assert said["o1"] == ONE_SHOT_KERNEL  # a cell with no output: the notice alone
    assert "variables do not survive the turn" in ONE_SHOT_KERNEL
    assert "NameError" in said["o2"] and said["o2"].endswith(ONE_SHOT_KERNEL)
    # What a replay reads back to describe the kernel as the recorded process did.
    assert lifetime_in(kept.description) == (30.0, False)


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
        print(next(iter(engine.kernels._sessions.values()))._sockets, flush=True)
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


def kernels_of_this_process() -> set[str]:
    """The socket folders of the kernels this process (a serve in the test's loop) runs."""
    mine = re.compile(f"/[^\0]*?{SOCKETS_PREFIX}{os.getpid()}-[^/\0]+")
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        found.update(mine.findall(argv))
    return found


async def test_deleting_through_the_serve_ends_the_conversations_kernel() -> None:
    """QA16c B1 through the browser's delete (DELETE /api/conversations/KEY): the serve's
    kernel of that conversation ends with it, and a new one of the same key starts empty."""
    provider = ScriptedProvider(
        [*cell("s1", "secret2 = 'pin 1234'"), *cell("s2", "print(secret2)")]
    )
    before = kernels_of_this_process()
    async with running_serve(provider) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "dk2")
        await ws.send(json.dumps({"type": "send", "text": "set it"}))
        await ws_until(ws, "idle")
        kept = kernels_of_this_process() - before
        assert len(kept) == 1, "the turn's kernel is not kept"
        sockets = Path(next(iter(kept)))
        async with serve.http() as http:
            deleted = await http.delete("/api/conversations/dk2", headers={"Origin": serve.url})
        assert deleted.status_code == 200, deleted.text
        assert await gone(sockets), "the deleted conversation's kernel still runs"
        await ws_hello(ws, "dk2")
        await ws.send(json.dumps({"type": "send", "text": "read it"}))
        read = await ws_next(ws)
        while not (read["type"] == "tool_end" and read["call_id"] == "s2"):
            read = await ws_next(ws)
        await ws_until(ws, "idle")
    assert "NameError" in read["result"] and "pin 1234" not in read["result"]
