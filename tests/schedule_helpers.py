"""A running AgentLoop, Dispatcher and Scheduler on a fake clock, for the scheduler's tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import Dispatcher, MessageBus, Outbound, OutboundMessage
from heron.config import Settings
from heron.messages import Message, Reply, Text, ToolCall
from heron.proactive.clock import FakeClock
from heron.proactive.scheduler import Scheduler
from heron.providers.base import ChatRequest
from heron.providers.scripted import ScriptedProvider
from heron.tools.message import with_message_tool
from heron.tools.registry import ToolRegistry
from heron.tools.schedule import schedule


def last_user_text(request: ChatRequest) -> str:
    for message in reversed(request.messages):
        if message.role == "user":
            return "\n".join(p.text for p in message.parts if isinstance(p, Text))
    return ""


def answer(text: str) -> Reply:
    return Reply([Text(text)], "done")


def call(name: str, args: dict, call_id: str = "c1") -> Reply:
    return Reply([ToolCall(call_id, name, args)], "tool")


@dataclass
class Rig:
    engine: Engine
    loop: AgentLoop
    bus: MessageBus
    clock: FakeClock
    scheduler: Scheduler
    provider: ScriptedProvider
    dispatcher: Dispatcher
    seen: list[Outbound] = field(default_factory=list)

    @property
    def messages(self) -> list[OutboundMessage]:
        """What a person watching the schedule channel would see (no turn events)."""
        return [o for o in self.seen if isinstance(o, OutboundMessage)]

    async def settle(self) -> None:
        """Until every fire's turn has ended, its outcome is recorded and the scheduler
        waits on the clock again."""
        for _ in range(3):
            await self.clock.idle()
            await self.bus.inbound.join()
            await self.loop.wait_idle()
            await self.bus.outbound.join()
        await self.clock.idle()

    async def at(self, when: float) -> None:
        self.clock.set(when)
        await self.settle()

    def transcript(self, key: str) -> list[Message]:
        conversation = self.engine.store.conversation(key)
        assert conversation is not None, f"no conversation {key}"
        return [m.message for m in self.engine.store.branch(conversation.id)]


@contextlib.asynccontextmanager
async def rig(
    script: Callable[[ChatRequest], Reply] | list,
    start: float,
    *,
    grace_s: float = 6 * 3600.0,
    run_scheduler: bool = True,
    registry: ToolRegistry | None = None,
) -> AsyncIterator[Rig]:
    provider = ScriptedProvider(script)
    tools = registry or with_message_tool(ToolRegistry([schedule]))
    async with Engine.open(Settings.load(), provider=provider, registry=tools) as engine:
        bus = MessageBus()
        loop = AgentLoop(engine, bus)
        dispatcher = Dispatcher(bus)
        clock = FakeClock(start)
        # The agent's zone, the one `make_job` reads schedules in (test_scheduler.py `local`).
        scheduler = Scheduler(engine.store, bus, clock, grace_s=grace_s, zone="Europe/Berlin")
        found = Rig(engine, loop, bus, clock, scheduler, provider, dispatcher)

        async def watch(o: Outbound) -> None:
            found.seen.append(o)

        dispatcher.register("schedule", watch)
        scheduler.watch(loop)
        engine.attached.jobs_changed = scheduler.poke
        tasks = [
            asyncio.create_task(loop.run(idle=False)),
            asyncio.create_task(dispatcher.run()),
        ]
        if run_scheduler:
            tasks.append(asyncio.create_task(scheduler.run()))
            await clock.idle()
        try:
            yield found
        finally:
            await loop.close()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
