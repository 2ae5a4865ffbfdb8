"""A channel's connection to an AgentLoop running in this process.

`heron run` and `heron chat` talk to the agent the same way whatever runs it: they publish an
InboundMessage and receive OutboundMessages and TurnEvents through a deliver function. Here the
AgentLoop and the Dispatcher run as tasks of this process; a client of a long-running `heron
serve` offers the same three calls over a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import Deliver, Dispatcher, InboundMessage, MessageBus
from heron.messages import File
from heron.proactive import wiring
from heron.proactive.subagents import Subagents
from heron.tools.context import Approver


@dataclass
class InProcessAgent:
    """Publish messages for one channel's chat; what comes back goes to its deliver function."""

    loop: AgentLoop
    channel: str
    chat_id: str
    subagents: Subagents | None = None

    async def send(
        self, text: str, key: str, agent: str = "default", files: tuple[File, ...] = ()
    ) -> None:
        """Publish, and return once the loop has taken it: its turn then runs (`running`),
        so a Ctrl-C read right after the chat's Enter stops it instead of finding nothing
        to stop (a busy moment can leave the key waiting until the next prompt reads it)."""
        self.send_nowait(text, key, agent, files)
        await self.loop.bus.inbound.join()

    def send_nowait(
        self, text: str, key: str, agent: str = "default", files: tuple[File, ...] = ()
    ) -> None:
        """From synchronous code too (a signal handler): the inbound queue is unbounded.
        `files` are the message's attachments (heron/attachments.py), already checked."""
        message = InboundMessage(
            self.channel, self.chat_id, text, key, agent=agent, events=True, files=files
        )
        self.loop.bus.inbound.put_nowait(message)

    def running(self, key: str) -> bool:
        return self.loop.running(key)

    async def settle(self) -> None:
        """Until no turn runs or waits and everything they sent has been delivered."""
        await wiring.settle(self.loop, self.subagents)

    def news(self) -> list[str]:
        """Nothing: a loop in this process is this Heron with its own settings (a serve's
        client says when the serve's differ, RemoteAgent.news)."""
        return []


@asynccontextmanager
async def connect(
    engine: Engine,
    channel: str,
    chat_id: str,
    deliver: Deliver,
    *,
    idle: bool = True,
    approve: Approver | None = None,
) -> AsyncIterator[InProcessAgent]:
    """Run the AgentLoop and the Dispatcher for the block; on leaving, running turns are
    stopped as by /stop (what they finished is kept) and both tasks end. `approve` asks the
    person before an unconfined command runs."""
    bus = MessageBus()
    loop = AgentLoop(engine, bus)
    if approve is not None:
        loop.approvers[channel] = approve
    dispatcher = Dispatcher(bus)
    dispatcher.register(channel, deliver)
    # Subagents, ask_user and goals run through this loop; a subagent's result left
    # unannounced by an earlier process is announced now (heron/proactive/wiring.py).
    proactive = wiring.attach(loop, channel=(channel, chat_id))
    tasks = [
        asyncio.create_task(loop.run(idle=idle)),
        asyncio.create_task(dispatcher.run()),
    ]
    if idle and engine.memory is not None:  # the nightly review of memory: its job alone
        # imported here: a one-message `heron run` (idle=False) never loads the scheduler
        from heron.proactive.background import run_review_only

        tasks.append(asyncio.create_task(run_review_only(loop, engine)))
    try:
        await proactive.start(announce=idle)  # a one-message `heron run` leaves them to a chat
        yield InProcessAgent(loop, channel, chat_id, proactive.subagents)
    finally:
        await proactive.close()
        await loop.close()
        await bus.outbound.join()  # the stopped turns' last events reach the channel
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
