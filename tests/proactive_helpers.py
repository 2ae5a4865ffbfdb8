"""Shared pieces of the proactive tests: a model routed by conversation, a fake clock, a loop
with a recording channel."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import Dispatcher, MessageBus, OutboundMessage
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool

_KEY = re.compile(r"Conversation: (\S+)")


def migrated_before(path: Path, step: str) -> sqlite3.Connection:
    """A SQLite database at `path` with every migration before `step` applied, as an older
    Heron left it: for a test of what `step` keeps."""
    from heron.store.migrations import _apply, _names, _step

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)")
    for name in _names():
        if name < step:
            _apply(conn, _step(name))
            conn.execute("INSERT INTO _migrations VALUES (?, 0)", (name,))
    return conn


Answer = Callable[[ChatRequest, int], Awaitable[Reply] | Reply]


def conversation_of(request: ChatRequest) -> str:
    for message in request.messages:
        for part in message.parts:
            found = _KEY.search(getattr(part, "text", "") or "")
            if found:
                return found.group(1)
    return "?"


def text(s: str) -> Reply:
    return Reply([Text(s)], "done", Usage(10, 2))


def call(name: str, n: int = 1, **args: object) -> Reply:
    return Reply([ToolCall(f"c{n}-{name}", name, dict(args))], "tool_use", Usage(10, 2))


@tool
async def note(ctx: ToolContext, what: str) -> str:
    """Note something down.

    Args:
        what: The note.
    """
    return f"noted: {what}"


def tools() -> ToolRegistry:
    """A registry with one harmless tool (`spawn`, `ask_user` and `goal` are attached)."""
    return ToolRegistry([note])


def last_user_text(request: ChatRequest) -> str:
    for message in reversed(request.messages):
        if message.role == "user" and message.text:
            return message.text
    return ""


def spawns_then_answers(request: ChatRequest, n: int) -> Reply:
    """An origin conversation's model: spawns a subagent to add 40 and 2, says so, and answers
    the subagent's result when it comes."""
    if n == 1:
        return call("spawn", task="Add 40 and 2.")
    if n == 2:
        return text("I asked a subagent.")
    assert "[Subagent result" in last_user_text(request)
    return text("The subagent says 42.")


@dataclass
class Routed:
    """A model whose answers depend on the conversation (key prefix) and the call's number
    in it; records every request by conversation."""

    routes: dict[str, Answer]
    seen: dict[str, list[ChatRequest]] = field(default_factory=dict)

    async def __call__(self, request: ChatRequest) -> Reply:
        key = conversation_of(request)
        calls = self.seen.setdefault(key, [])
        calls.append(request)
        for prefix, answer in self.routes.items():
            if key.startswith(prefix):
                out = answer(request, len(calls))
                return await out if asyncio.iscoroutine(out) else out  # type: ignore[return-value]
        raise AssertionError(f"no route for {key}")


class FakeSleep:
    """A clock for timeouts: `sleep(s)` returns when the test says the time has come."""

    def __init__(self) -> None:
        self.fire = asyncio.Event()
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        await self.fire.wait()


@contextlib.asynccontextmanager
async def running_loop(
    model: Routed, registry: ToolRegistry | None = None
) -> AsyncIterator[tuple[Engine, AgentLoop, list[OutboundMessage]]]:
    bus = MessageBus()
    dispatcher = Dispatcher(bus)
    said: list[OutboundMessage] = []

    async def record(out: OutboundMessage) -> None:
        said.append(out)

    dispatcher.register("test", record)
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(model), registry=registry or ToolRegistry([])
    ) as engine:
        loop = AgentLoop(engine, bus)
        pump = asyncio.create_task(dispatcher.run())
        try:
            yield engine, loop, said
        finally:
            await loop.close()
            await bus.outbound.join()
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump


class FakeClock:
    """Time that moves only when the test says: `sleep(s)` returns once `advance` has passed
    its instant; `now()` is the clock's time."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self.waiting = asyncio.Event()  # set whenever someone starts sleeping

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.t + seconds, future))
        self.waiting.set()
        try:
            await future
        finally:
            self._sleepers = [(u, f) for u, f in self._sleepers if f is not future]

    async def sleepers(self, n: int) -> None:
        """Until `n` sleeps are waiting (yielding to the tasks that start them)."""
        while len(self._sleepers) < n:
            await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self.t += seconds
        for until, future in list(self._sleepers):
            if until <= self.t and not future.done():
                future.set_result(None)
