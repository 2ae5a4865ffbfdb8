"""AgentLoop: consumes the bus, one turn per conversation at a time, conversations concurrent.

A message for a conversation whose turn is running goes into that turn's mailbox; the runner
drains it after each tool phase and after a final-looking reply, so the follow-up is answered in
the same turn. Mail that arrives after the last drain starts the next turn. /stop, /new and
/status for a busy conversation run at once instead of queueing behind the turn.

/stop is a hard break: the epoch is bumped (so whatever the turn still tries to commit is
discarded), the task is cancelled, and its finished tool results are restored into the record.
`request_break` is the soft one: the run wraps up at its next drain, and if it has not drained
within `break_grace` seconds the break escalates to a hard one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from heron.agent import commands
from heron.agent.engine import Engine, TurnHooks, TurnResult
from heron.agent.turn import TurnControl
from heron.bus import InboundMessage, MessageBus, OutboundMessage
from heron.errors import HeronError
from heron.store import engine_state as es

BREAK_GRACE = 20.0
IDLE_POLL = 60.0
log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def idle_compaction(
    engine: Engine, poll_s: float = IDLE_POLL
) -> AsyncIterator[asyncio.Task[None] | None]:
    """Idle compaction (heron.compaction.idle_loop) in the background while the block runs,
    cancelled when it ends; none when idle_compact_after_minutes is 0."""
    if engine.settings.config.agent.idle_compact_after_minutes <= 0:
        yield None
        return
    from heron.compaction import idle_loop

    task = asyncio.create_task(idle_loop(engine, poll_s))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass
class _Active:
    task: asyncio.Task[TurnResult | None]
    control: TurnControl
    message: InboundMessage


@dataclass
class AgentLoop:
    engine: Engine
    bus: MessageBus
    break_grace: float = BREAK_GRACE
    idle_poll: float = IDLE_POLL  # seconds between idle-compaction sweeps
    routes: dict[tuple[str, str], str] = field(default_factory=dict)  # /resume switches
    _active: dict[str, _Active] = field(default_factory=dict)
    _pending: dict[str, deque[InboundMessage]] = field(default_factory=dict)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def resolve(self, message: InboundMessage) -> str:
        """The conversation key: explicit, else the route /resume set, else channel:chat."""
        if message.key:
            return message.key
        return self.routes.get((message.channel, message.chat_id)) or (
            f"{message.channel}:{message.chat_id}"
        )

    def running(self, key: str) -> bool:
        return key in self._active

    async def run(self) -> None:
        """Consume the bus until cancelled; idle compaction sweeps in the background."""
        async with idle_compaction(self.engine, self.idle_poll):
            while True:
                await self.dispatch(await self.bus.inbound.get())

    async def dispatch(self, message: InboundMessage) -> None:
        key = self.resolve(message)
        found = commands.parse(message.text)
        active = self._active.get(key)
        if active is None:
            self._start(key, message)
            return
        if found is not None and found.name in commands.PRIORITY:
            await self._priority(found, key, message)
            return
        if found is None and active.control.post(message.text):
            return  # answered in the running turn
        self._pending.setdefault(key, deque()).append(message)

    async def _priority(self, found: commands.Command, key: str, message: InboundMessage) -> None:
        if found.name == "new":
            await self.stop(key)
            self._start(key, message)
            return
        ctx = commands.CommandContext(
            self.engine, key, message.agent, stop_local=self.stop, running_local=self.running
        )
        reply = await commands.run(found, ctx)
        if reply.text:
            await self._send(message, key, reply.text, "command")

    # ---- turns ----------------------------------------------------------------------------

    def _start(self, key: str, message: InboundMessage) -> None:
        control = TurnControl(key, message.provenance)
        control.deliver = lambda text: self._speak(control, message, key, text)
        task = asyncio.create_task(self._turn(key, message, control))
        self._active[key] = _Active(task, control, message)
        self._idle.clear()
        task.add_done_callback(lambda _: self._finished(key, control, message))

    async def _turn(
        self, key: str, message: InboundMessage, control: TurnControl
    ) -> TurnResult | None:
        def busy(note: str) -> None:
            if control.visible:
                self.bus.outbound.put_nowait(
                    OutboundMessage(message.channel, message.chat_id, key, note, "notice")
                )

        hooks = TurnHooks(on_busy=busy, control=control)
        try:
            result = await self.engine.turn(key, message.text, hooks, agent=message.agent)
        except Exception as error:  # a turn's failure must not take the loop down
            if not isinstance(error, HeronError):
                log.exception("turn of %s failed", key)
            if control.visible and not control.stale:
                await self._send(message, key, f"The turn failed: {error}", "error")
            return None
        if result.switch_to:
            self.routes[(message.channel, message.chat_id)] = result.switch_to
        if result.reply is not None and not control.stale:  # RESPOND's last token check
            kind = "command" if result.command and result.run.model_calls == 0 else "answer"
            await self._send(message, key, result.reply, kind)
        return result

    def _finished(self, key: str, control: TurnControl, message: InboundMessage) -> None:
        self._active.pop(key, None)
        queue = self._pending.setdefault(key, deque())
        if control.mailbox and not control.stale:
            # Typed after the run's last drain: it opens the next turn instead of being lost.
            text = "\n\n".join(control.mailbox)
            queue.appendleft(dataclasses.replace(message, text=text, key=key))
            control.mailbox = []
        if queue:
            self._start(key, queue.popleft())
        elif not self._active:
            self._idle.set()

    async def _speak(
        self, control: TurnControl, message: InboundMessage, key: str, text: str
    ) -> None:
        if not control.stale:
            await self._send(message, key, text, "message")

    async def _send(self, message: InboundMessage, key: str, text: str, kind: str) -> None:
        await self.bus.send(
            OutboundMessage(message.channel, message.chat_id, key, text, kind)  # type: ignore[arg-type]
        )

    # ---- interrupts -----------------------------------------------------------------------

    async def stop(self, key: str) -> bool:
        """Hard break: bump the epoch, cancel the turn, wait until it has cleaned up."""
        active = self._active.get(key)
        if active is None:
            return False
        active.control.stale = True
        if active.control.conversation_id is not None:
            await self.engine.store.call(
                es.bump_epoch, self.engine.store, active.control.conversation_id
            )
        active.task.cancel()
        await asyncio.wait({active.task})
        return True

    def request_break(self, key: str) -> bool:
        """Soft break: wrap up at the next drain; a hard break if not drained in time."""
        active = self._active.get(key)
        if active is None:
            return False
        active.control.request_break()
        loop = asyncio.get_running_loop()
        loop.call_later(self.break_grace, self._escalate, key, active)
        return True

    def _escalate(self, key: str, active: _Active) -> None:
        if self._active.get(key) is not active or active.control.break_seen:
            return
        active.control.stale = True
        if active.control.conversation_id is not None:  # one short write; fine on the loop
            es.bump_epoch(self.engine.store, active.control.conversation_id)
        active.task.cancel()

    async def wait_idle(self) -> None:
        """Until no turn is running or waiting (tests, shutdown)."""
        while self._active or any(self._pending.values()):
            self._idle.clear()
            await self._idle.wait()

    async def close(self) -> None:
        for key in list(self._active):
            await self.stop(key)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)
