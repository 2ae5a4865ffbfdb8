"""The bus between channels and the engine.

Channels publish `InboundMessage`s; the `AgentLoop` consumes them and publishes
`OutboundMessage`s; the `Dispatcher` hands each outbound message to the channels registered for
it. The dispatcher is the one place where replies are delivered implicitly: nothing else in
Heron writes to a channel on a turn's behalf.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

Provenance = Literal["user", "scheduled", "subagent", "internal"]
OutKind = Literal["answer", "message", "command", "error", "notice"]


@dataclass(frozen=True)
class InboundMessage:
    channel: str  # "terminal", "web", "scheduler", "subagent", ...
    chat_id: str  # which chat on that channel
    text: str
    key: str | None = None  # the conversation key; None: derived from channel and chat
    provenance: Provenance = "user"
    agent: str = "default"
    meta: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OutboundMessage:
    channel: str
    chat_id: str
    key: str  # the conversation it belongs to
    text: str
    kind: OutKind = "answer"


Deliver = Callable[[OutboundMessage], Awaitable[None]]


class MessageBus:
    """Two queues: what channels send in, what the engine sends out."""

    def __init__(self) -> None:
        self.inbound: asyncio.Queue[InboundMessage] = asyncio.Queue()
        self.outbound: asyncio.Queue[OutboundMessage] = asyncio.Queue()

    async def publish(self, message: InboundMessage) -> None:
        await self.inbound.put(message)

    async def send(self, message: OutboundMessage) -> None:
        await self.outbound.put(message)


class Dispatcher:
    """Delivers outbound messages: to the channel they name, and to any watcher of "*"."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self._channels: dict[str, list[Deliver]] = {}

    def register(self, channel: str, deliver: Deliver) -> None:
        self._channels.setdefault(channel, []).append(deliver)

    async def deliver(self, message: OutboundMessage) -> int:
        targets = self._channels.get(message.channel, []) + self._channels.get("*", [])
        for target in targets:
            await target(message)
        return len(targets)

    async def run(self) -> None:
        while True:
            message = await self.bus.outbound.get()
            try:
                await self.deliver(message)
            finally:
                self.bus.outbound.task_done()
