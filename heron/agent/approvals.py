"""Command approvals in `heron serve`: an unconfined command (approval "ask",
heron/tools/approval.py) is asked of every client of its conversation.

The AgentLoop gets `approver_for`: each visible turn's approver puts an `approval` TurnEvent on
the bus (after the tool's `tool_start`, in order), which the hub numbers and sends to every
client of the conversation and keeps for clients that attach while it waits. The first
`approve` from any client of that conversation decides; later answers are ignored. The wait
ends with an `approval_end` event whatever ends it: an answer, /stop, /new or shutdown
(the turn is cancelled, and the approval with it), or the deadline, after which the command
is declined and the model told why. See docs/web.md ("## Protocol") and docs/security.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from dataclasses import dataclass, field

from heron.bus import ApprovalAsk, EventKind, InboundMessage, MessageBus, TurnEvent
from heron.tools.approval import DECLINED, UNANSWERED
from heron.tools.context import Approver

APPROVAL_DEADLINE = 600.0  # seconds an approval waits for an answer before it is declined


@dataclass
class _Waiting:
    """An approval waiting in conversation `key`: answered with (allowed, the client's id)."""

    key: str
    answer: asyncio.Future[tuple[bool, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Approvals:
    """The approvals of a serve's turns that wait for an answer, by id."""

    def __init__(self, bus: MessageBus, deadline: float | None = None) -> None:
        self.bus = bus
        self.deadline = APPROVAL_DEADLINE if deadline is None else deadline
        self.waiting: dict[str, _Waiting] = {}

    def approver(self, key: str, message: InboundMessage) -> Approver:
        """The approver of a turn in `key` opened by `message` (the AgentLoop's approver_for)."""

        async def approve(tool: str, command: str, confined: bool) -> str | None:
            return await self.ask(key, message, tool, command, confined)

        return approve

    async def ask(
        self, key: str, message: InboundMessage, tool: str, command: str, confined: bool = False
    ) -> str | None:
        """Ask the conversation's clients; None when one allowed the command, else why not."""
        # Random ids: a tab left open across a restart cannot answer a new approval by chance.
        ask = ApprovalAsk(secrets.token_hex(6), tool, command, time.time() + self.deadline)
        ask = dataclasses.replace(ask, confined=confined)
        waiting = self.waiting[ask.id] = _Waiting(key)
        self._emit(message, key, "approval", ask)
        end = dataclasses.replace(ask, reason="stopped")
        try:
            allowed, by = await asyncio.wait_for(waiting.answer, self.deadline)
            end = dataclasses.replace(ask, allowed=allowed, by=by, reason="answered")
        except TimeoutError:
            end = dataclasses.replace(ask, reason="deadline")
        finally:  # stopped (cancelled) included: nothing is left waiting, every client told
            del self.waiting[ask.id]
            self._emit(message, key, "approval_end", end)
        if end.reason == "deadline":
            return UNANSWERED.format(minutes=round(self.deadline / 60))
        return None if end.allowed else DECLINED

    def answer(self, key: str | None, approval_id: str, allow: bool, chat_id: str) -> bool:
        """A client's answer; False (and ignored) when no approval of its conversation with
        that id waits any more (answered first by another client, stopped, past its deadline)."""
        waiting = self.waiting.get(approval_id)
        if waiting is None or waiting.key != key or waiting.answer.done():
            return False
        waiting.answer.set_result((allow, chat_id))
        return True

    def _emit(self, message: InboundMessage, key: str, kind: EventKind, ask: ApprovalAsk) -> None:
        """On the bus, so that it reaches the hub in order with the turn's other events."""
        chat, origin = message.chat_id, message.provenance
        self.bus.emit(TurnEvent(message.channel, chat, key, kind, provenance=origin, approval=ask))
