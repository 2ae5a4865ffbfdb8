"""How much code one ordinary turn runs: the distinct functions it enters, and their modules.

One `heron run` in this process (heron/channels/script.py `run_once`: the engine opened, the
message through the bus and the AgentLoop, the turn's steps, the answer printed, the engine
closed) in a temporary `HERON_HOME`, with a scripted model that makes one tool call
(`read_file` of a file in the workspace) and then answers. A first run, not profiled, loads
every module and warms what a process keeps; the second runs under `sys.setprofile` (and
`threading.setprofile`, for the store's worker threads) and counts every Python function
entered (a code object: module bodies are not counted). Heron's own are those under heron/.

    .venv/bin/python bench/turn_profile.py [--json] [--list]

The issue's "before" (issue 12, at 054eb30) was 268 distinct functions of Heron's in 33
modules. tests/test_architecture_map.py runs the same turn to check that every function
docs/architecture.md names on the path of a turn is entered.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heron.config import Settings
    from heron.providers.scripted import ScriptedProvider

HERON_DIR = str(Path(__file__).resolve().parents[1] / "heron") + os.sep
NOTES = "Heron keeps every turn.\n"
QUESTION = "What does notes.txt say?"
ANSWER = "It says that Heron keeps every turn."


@dataclass(frozen=True)
class Entered:
    """The code objects a profiled block entered."""

    codes: frozenset[CodeType]

    def heron(self) -> frozenset[CodeType]:
        return frozenset(c for c in self.codes if c.co_filename.startswith(HERON_DIR))

    def figures(self) -> dict[str, int]:
        mine = self.heron()
        return {
            "functions": len(self.codes),
            "modules": len({c.co_filename for c in self.codes}),
            "heron_functions": len(mine),
            "heron_modules": len({c.co_filename for c in mine}),
        }


@contextmanager
def profiled() -> Iterator[set[CodeType]]:
    """Every Python function entered in the block, on this thread and on threads it starts."""
    seen: set[CodeType] = set()

    def hook(frame: FrameType, event: str, _: object) -> None:
        if event == "call" and frame.f_code.co_name != "<module>":
            seen.add(frame.f_code)

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        yield seen
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def _setup(home: Path) -> tuple[Settings, ScriptedProvider]:
    """A fresh home with notes.txt in its workspace, and the model's script for it."""
    from heron.config import Settings
    from heron.messages import Reply, Text, ToolCall
    from heron.providers.scripted import ScriptedProvider

    os.environ["HERON_HOME"] = str(home)
    settings = Settings.load()
    settings.paths.ensure()
    (settings.paths.workspace / "notes.txt").write_text(NOTES)
    script = [
        Reply([ToolCall("call_1", "read_file", {"path": "notes.txt"})], "tool"),
        Reply([Text(ANSWER)], "done"),
    ]
    return settings, ScriptedProvider(script)


async def one_run(home: Path) -> str:
    """`heron run` in-process, one message whose answer needs one tool call; what it printed."""
    from heron.channels.script import run_once

    settings, provider = _setup(home)
    out, err = io.StringIO(), io.StringIO()
    ok = await run_once(
        settings, QUESTION, "default", "run-profile", None, False, out, err, provider
    )
    provider.assert_complete()
    if not ok:
        raise RuntimeError(f"the profiled turn failed: {err.getvalue()}")
    return out.getvalue()


async def one_turn(home: Path) -> tuple[Entered, str]:
    """The same message with the engine and the channel's connection already open (what a
    `heron chat` or a serve has between turns): only the turn is profiled, from the channel's
    send to the end delivered."""
    from heron.agent.engine import Engine
    from heron.bus import Outbound, TurnEvent
    from heron.channels.inprocess import connect

    settings, provider = _setup(home)
    said: list[str] = []

    async def deliver(item: Outbound) -> None:
        if isinstance(item, TurnEvent) and item.kind == "delta":
            said.append(item.text)

    async with (
        Engine.open(settings, provider=provider) as engine,
        connect(engine, "script", "stdin", deliver, idle=False) as conn,
    ):
        with profiled() as seen:
            await conn.send(QUESTION, "turn-profile")
            await conn.settle()
    provider.assert_complete()
    return Entered(frozenset(seen)), "".join(said)


@contextmanager
def home_at(path: Path) -> Iterator[Path]:
    """HERON_HOME pointed at `path` for the block, as it was afterwards."""
    previous = os.environ.get("HERON_HOME")
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop("HERON_HOME", None)
        else:
            os.environ["HERON_HOME"] = previous


def profile_run(root: Path) -> tuple[Entered, str]:
    """A warm-up `heron run` in one home, then the profiled one in a fresh home: what it
    entered and what it printed."""
    with home_at(root):
        asyncio.run(one_run(root / "warm"))
        with profiled() as seen:
            printed = asyncio.run(one_run(root / "measured"))
    return Entered(frozenset(seen)), printed


def profile_turn(root: Path) -> tuple[Entered, str]:
    """A warm-up run, then one turn on an open engine, profiled from send to settle."""
    with home_at(root):
        asyncio.run(one_run(root / "warm"))
        return asyncio.run(one_turn(root / "turn"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON line as well")
    parser.add_argument("--list", action="store_true", help="list Heron's functions entered")
    args = parser.parse_args()
    os.environ.setdefault("HERON_EMBEDDINGS", "0")  # BM25 recall, as in the tests
    with tempfile.TemporaryDirectory() as tmp:
        turn, said = profile_turn(Path(tmp) / "a")
        run, printed = profile_run(Path(tmp) / "b")
    for answer in (said, printed):
        if answer.strip() != ANSWER:
            raise SystemExit(f"unexpected answer: {answer!r}")
    if args.list:
        for code in sorted(turn.heron(), key=lambda c: (c.co_filename, c.co_firstlineno)):
            where = code.co_filename[len(HERON_DIR) - len("heron/") :]
            print(f"{where}:{code.co_firstlineno} {code.co_qualname}")
    figures = turn.figures()
    whole = run.figures()
    for label, f in (("one turn (open engine)", figures), ("whole `heron run`", whole)):
        print(
            f"{label:<24} {f['functions']} functions in {f['modules']} modules; Heron's own "
            f"{f['heron_functions']} in {f['heron_modules']}"
        )
    if args.json:
        print(json.dumps({**figures, **{f"run_{k}": v for k, v in whole.items()}}))


if __name__ == "__main__":
    main()
