"""AgentLoop: consumes the bus, one turn per conversation at a time, conversations concurrent.

Every channel enters here: `heron run` and `heron chat` publish an InboundMessage and read back
OutboundMessages and, when they ask for them, the turn's TurnEvents (heron/bus.py); the engine
never writes to a screen.

A message for a conversation whose turn is running goes into that turn's mailbox; the runner
drains it after each tool phase and after a final-looking reply, so the follow-up is answered in
the same turn. Mail that arrives after the last drain, or that a /stop or /new overtook, is kept
and opens the next turn (after the fresh context, for /new). /stop, /new, /status and /goal for
a busy conversation run at once instead of queueing behind the turn.

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
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from heron.agent import commands
from heron.agent.control import NEVER_MAILED, TurnControl, Unread, mail_label
from heron.agent.engine import Engine, TurnHooks, TurnResult
from heron.agent.relay import RelayDesk, Relayed, keep_words
from heron.agent.runner import ToolCallRecord
from heron.agent.turn import NOT_SAVED, message_unsaved, person_parts
from heron.bus import (
    KEEPING_CODE,
    UNANSWERED_CODE,
    EventKind,
    InboundMessage,
    MessageBus,
    OutboundMessage,
    OutKind,
    TurnEnd,
    TurnEvent,
    TurnOptions,
    stopped_by,
)
from heron.errors import HeronError, ProviderError, model_unusable, one_line
from heron.messages import Message, ToolCall, ToolResult, file_label
from heron.request import StreamEvent
from heron.store import engine_state as es
from heron.store import held
from heron.tools.context import Approver

if TYPE_CHECKING:
    from heron.compaction import idle

BREAK_GRACE = 20.0
# Stream events as turn events; a "retry" stream event is the RetryFilter's mark that the
# reply starts again (heron/agent/runner.py).
_STREAMED: dict[str, EventKind] = {"thinking": "reasoning", "retry": "restart"}
IDLE_POLL = 60.0
# Seconds `close` waits for the moves of background work's messages still under way.
RELAY_DRAIN = 5.0
# Seconds with no turn of the person's (and since the loop started) before idle-time work takes
# its next step: a person reading a reply and typing the next message, or a script sending
# them one after another, finds the loop free.
QUIET_S = 2.0
# Seconds a /stop waits for the message of the turn it stops to be stored (`_stored_first`):
# milliseconds unless the disk stalls.
STORE_WAIT_S = 5.0
# What the person is told when a stop beat their message to the store after all.
STOPPED_UNSAVED = "Stopped before your message was stored: it is not kept, send it again."
log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def idle_compaction(
    engine: Engine, poll_s: float = IDLE_POLL, quiet: idle.Quiet | None = None
) -> AsyncIterator[asyncio.Task[None] | None]:
    """Idle compaction (heron.compaction.idle_loop) in the background while the block runs,
    cancelled when it ends; none when idle_compact_after_minutes is 0. `quiet`: when its steps
    may run (`AgentLoop.person_first`) and what stops one under way (`person_arrives`)."""
    if engine.settings.config.agent.idle_compact_after_minutes <= 0:
        yield None
        return
    from heron.compaction import idle_loop

    task = asyncio.create_task(idle_loop(engine, poll_s, quiet))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass(frozen=True)
class TurnEnded:
    """How a conversation's turn ended, as every end-of-turn hook hears it: `end` always (what
    the channel was told: ok, outcome, error, usage), `result` when the turn returned one
    (None: it failed or was stopped)."""

    key: str
    message: InboundMessage
    end: TurnEnd
    result: TurnResult | None


TurnEndHook = Callable[[TurnEnded], None]


def _log_end(key: str, end: TurnEnd) -> None:
    """A turn's end in the log, on one line: its outcome; a failure as failed, with its error
    and hint (its outcome says how the person was told: "delivered"). At INFO both: a serve
    logs INFO, and a chat in its own process shows WARNING on its screen, where the failure
    is shown already."""
    if end.ok or not end.error:
        log.info("turn ended in %s: %s, %d model calls", key, end.outcome, end.model_calls)
    else:
        log.info("turn failed in %s: %s", key, one_line(end.error))


@dataclass
class _Active:
    task: asyncio.Task[TurnResult | None]
    control: TurnControl
    message: InboundMessage
    end: TurnEnd | None = None  # set by the turn itself as it ends (what its channel heard)


@dataclass
class AgentLoop:
    engine: Engine
    bus: MessageBus
    break_grace: float = BREAK_GRACE
    idle_poll: float = IDLE_POLL  # seconds between idle-compaction sweeps
    quiet_s: float = QUIET_S  # see `person_first`
    routes: dict[tuple[str, str], str] = field(default_factory=dict)  # /resume switches
    # Who asks the person before an unconfined command runs, by channel (heron/tools/approval.py);
    # a channel with none gets a refusal the model reads.
    approvers: dict[str, Approver] = field(default_factory=dict)
    # Who asks instead, for every channel, given the conversation and the message that opened
    # the turn: `heron serve` asks all the conversation's clients (heron/agent/approvals.py).
    approver_for: Callable[[str, InboundMessage], Approver] | None = None
    # The one end-of-turn mechanism (`watch_turns`): told, synchronously and in order, how every
    # turn ended, after the conversation's next queued message started (so a hook sees whether
    # the person's message goes next). The scheduler and heartbeat record their runs here;
    # subagents settle what the turn was owed; goals continue with a nudge turn.
    turn_end_hooks: list[TurnEndHook] = field(default_factory=list)
    _active: dict[str, _Active] = field(default_factory=dict)
    _pending: dict[str, deque[InboundMessage]] = field(default_factory=dict)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Set while no turn the person started runs; when the last one ended (or the loop started).
    _no_person: asyncio.Event = field(default_factory=asyncio.Event)
    # Set while a turn the person started runs (`person_arrives`): the inverse of the above.
    _person_on: asyncio.Event = field(default_factory=asyncio.Event)
    _person_at: float = field(default_factory=time.monotonic)
    # Where each conversation's last message came from (channel, chat, provenance): where a
    # subagent's result is announced (heron/proactive/subagents.py).
    origins: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # The options of a turn started for a message (a conversation's sustained goal takes the
    # model deadline off, heron/proactive/goals.py); None: the message's own.
    options_for: Callable[[str, InboundMessage], TurnOptions | None] | None = None
    # Whether a visible turn Heron starts itself (a subagent's result, a goal's nudge) streams
    # its TurnEvents like a person's: `heron serve` shows every turn of a conversation to all
    # its clients as it runs; a chat of one channel reads such a turn's answer only.
    heron_turn_events: bool = False
    # Whether a client has the conversation open now (`heron serve`'s hub): what the `message`
    # tool of background work tells its model. None: not known (no serve).
    attended: Callable[[str], bool] | None = None
    # What background work says to a conversation, on its way into it (after a turn there).
    relays: RelayDesk = field(init=False)
    # Whether a turn a dead process left open is continued rather than closed (workers,
    # heron/scale/): background work's messages then wait for that turn, not close it.
    continues_dead_turns: ClassVar[bool] = False
    # Set once shutdown begins (`close`): no turn starts from then on, and what the person
    # sent that no turn read is kept in its conversation instead, by conversation (`_keep`).
    closing: bool = False
    _kept: dict[str, list[InboundMessage]] = field(default_factory=dict)
    _closed_by: str = "Heron stopped"
    _closed: bool = False  # the kept words are stored: what comes now is not taken at all

    def __post_init__(self) -> None:
        self.relays = RelayDesk(self.engine.store, close_dead=not self.continues_dead_turns)
        self._no_person.set()

    def resolve(self, message: InboundMessage) -> str:
        """The conversation key: explicit, else the route /resume set, else channel:chat."""
        if message.key:
            return message.key
        return self.routes.get((message.channel, message.chat_id)) or (
            f"{message.channel}:{message.chat_id}"
        )

    def running(self, key: str) -> bool:
        return key in self._active

    def watch_turns(self, hook: TurnEndHook) -> Callable[[], None]:
        """Add an end-of-turn hook (see `turn_end_hooks`); returns what removes it again."""
        self.turn_end_hooks.append(hook)

        def unwatch() -> None:
            if hook in self.turn_end_hooks:
                self.turn_end_hooks.remove(hook)

        return unwatch

    @property
    def turns_running(self) -> int:
        """How many turns run now (the serve's shutdown line says it)."""
        return len(self._active)

    @property
    def busy(self) -> bool:
        """Some turn runs (idle-time work waits)."""
        return bool(self._active)

    def user_turn_running(self) -> bool:
        """Whether a turn the person started runs now (the heartbeat waits for it to end)."""
        return any(a.message.provenance == "user" for a in self._active.values())

    async def person_first(self) -> None:
        """Until no turn the person started runs, none has for `quiet_s` seconds, and the loop
        has run that long: idle-time work (idle compaction) waits here before each step, so a
        message the person sends goes first instead of sharing the process with it (a serve
        started on a big home has hundreds of conversations to consolidate)."""
        while True:
            if self.user_turn_running():
                await self._no_person.wait()
                continue
            left = self._person_at + self.quiet_s - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(left)

    async def person_arrives(self) -> None:
        """Until a turn the person started runs: idle-time work in the middle of a step stops
        for it (a local model serves one request at a time, so the person's would wait for a
        whole summary to be written) and takes the step again later."""
        await self._person_on.wait()

    async def run(self, *, idle: bool = True) -> None:
        """Consume the bus until cancelled; idle compaction sweeps in the background unless
        `idle` is False (a one-message `heron run` has no idle time)."""
        self._person_at = time.monotonic()
        if not idle:
            await self._consume()
            return
        from heron.compaction.idle import Quiet

        quiet = Quiet(self.person_first, self.person_arrives)
        async with idle_compaction(self.engine, self.idle_poll, quiet):
            await self._consume()

    async def _consume(self) -> None:
        inbound = self.bus.inbound
        while True:
            message = await inbound.get()
            try:
                await self.dispatch(message)
            except Exception as error:  # one message must not stop the loop for every other
                await self._not_started(message, error)
            finally:
                inbound.task_done()  # a channel can wait until its messages are dispatched

    async def _not_started(self, message: InboundMessage, error: Exception) -> None:
        """A message whose turn could not start (the database out of reach as its
        conversation's settings were read): told to its sender as a failed turn that stored
        nothing, so a client waiting for its end is not left waiting."""
        key = message.key or f"{message.channel}:{message.chat_id}"
        with contextlib.suppress(Exception):
            key = self.resolve(message)
        if isinstance(error, HeronError):
            log.warning("a message of %s could not start its turn: %s", key, error.summary)
        else:
            log.exception("a message of %s could not start its turn", key)
        lost = commands.parse(message.text) is None  # a command stores no message of its own
        said = f"The turn failed: {error}" + (f"\n{NOT_SAVED}" if lost else "")
        self._event(message, key, "turn_start", message.text)  # whose end its sender waits for
        await self._send(message, key, said, "error")
        self._event(
            message, key, "turn_end", end=TurnEnd(False, "failed", str(error), unsaved=lost)
        )

    async def dispatch(self, message: InboundMessage) -> None:
        key = self.resolve(message)
        if self.closing and message.id is None:  # shutting down: kept, never started
            self._keep(key, [message])
            return
        found = commands.parse(message.text)
        active = self._active.get(key)
        if active is None:
            self._start(key, message)
            return
        if found is not None and found.name in commands.PRIORITY:
            await self._priority(found, key, message)
            return
        refused = commands.switch_refused(found, key)
        if refused is not None:  # queued, it would leave the next message here, as mail
            await self._send(message, key, refused, "error")
            return
        question = active.control.question
        if found is None and question is not None and question.answer(message.text):
            self._event(message, key, "mail", message.text)  # the waiting run resumes (ask_user)
            return
        if found is None and message.provenance == "user" and not message.id and not message.held:
            message = await self._hold(key, message)
            active = self._active.get(key)
            if active is None:  # its turn ended while the file was written: it opens the next
                await self.dispatch(message)
                return
        post = active.control.post
        if (
            found is None
            and mailable(message)
            and post(message.text, None, message.channel, message)
        ):
            self._event(message, key, "mail", message.text)  # answered in the running turn
            return
        self._pending.setdefault(key, deque()).append(message)
        self._event(message, key, "queued")

    async def _hold(self, key: str, message: InboundMessage) -> InboundMessage:
        """The person's message for a busy conversation (mail, or queued behind the turn),
        written to disk before its sender is told it was taken: a kill -9 of this process
        loses none (heron/store/held.py). A store that refuses the write leaves it in memory
        only, as it always was, and the log says so."""
        store, engine = self.engine.store, self.engine
        try:
            made = person_parts(engine, message.text, message.files)
            row = await store.call(
                held.hold,
                store,
                key,
                message.agent,
                Message("user", made.parts),
                made.meta(None),
                off_loop=bool(message.files),
            )
        except Exception:
            log.exception("keeping a message of %s on disk failed: it waits in memory", key)
            return message
        return dataclasses.replace(message, held=(row,))

    def _give_up(self, message: InboundMessage, key: str) -> None:
        """The held rows of a message its sender was told is not kept (a stop or failure
        before its turn stored it, or too late at shutdown): they must not bring it back."""
        try:
            held.consume(self.engine.store, message.held)
        except Exception:
            log.exception("a message of %s given up stays held on disk", key)

    async def _priority(self, found: commands.Command, key: str, message: InboundMessage) -> None:
        if found.name == "new":
            # /new runs next, then mail the stopped turn had not read, in the fresh context;
            # the stopped turn's end starts them (one turn of a conversation at a time).
            queue = self._pending.setdefault(key, deque())
            mail = self._active[key].control.mailbox.take()
            if mail:
                queue.appendleft(unread_mail(message, mail, key))
            queue.appendleft(message)
            await self.stop(key, stopped_by("new", message.channel))
            return
        await self._command_now(found, key, message)

    async def _command_now(
        self, found: commands.Command, key: str, message: InboundMessage
    ) -> None:
        """A command that does not wait for the running turn (/stop, /status): run and answered."""
        ctx = commands.CommandContext(
            self.engine,
            key,
            message.agent,
            stop_local=self.stop,
            running_local=self.running,
            channel=message.channel,
        )
        reply = await commands.run(found, ctx)
        if reply.text:
            await self._send(message, key, reply.text, "command", reply.code)

    # ---- turns ----------------------------------------------------------------------------

    def _start(self, key: str, message: InboundMessage) -> asyncio.Task[TurnResult | None]:
        control = TurnControl(key, message.provenance)
        if self.heron_turn_events and control.visible and not message.events:
            message = dataclasses.replace(message, events=True)
        control.options = message.options
        control.files, control.held = message.files, message.held
        control.mailbox.channel = message.channel  # mail from another channel says where from
        if self.options_for is not None:
            control.options = self.options_for(key, message)
        control.deliver = lambda text: self._speak(control, message, key, text)
        control.ask = lambda text: self._speak(control, message, key, text, "question")
        if message.provenance == "user":
            self.origins[key] = (message.channel, message.chat_id, message.provenance)
            self._no_person.clear()
            self._person_on.set()
        else:
            self.origins.setdefault(key, (message.channel, message.chat_id, message.provenance))
        task = asyncio.create_task(self._turn(key, message, control))
        self._active[key] = _Active(task, control, message)
        log.info("turn started in %s (%s, from %s)", key, message.provenance, message.channel)
        self._idle.clear()
        task.add_done_callback(lambda t: self._finished(key, control, message, t))
        return task

    async def run_turn(self, message: InboundMessage) -> TurnResult | None:
        """Run one turn for `message` through the loop and wait for it (a subagent's run, in a
        conversation of its own). None: the turn failed or was stopped."""
        key = self.resolve(message)
        if key in self._active:
            raise RuntimeError(f"a turn already runs in {key}")
        task = self._start(key, message)
        await asyncio.wait({task})
        if task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    def start_turn(self, message: InboundMessage) -> None:
        """A turn Heron starts itself (a goal's nudge): at once when the conversation is free,
        else after what waits there."""
        key = self.resolve(message)
        if self.closing and message.id is None:  # shutting down: no turn starts
            self._keep(key, [message])
        elif key in self._active:
            self._pending.setdefault(key, deque()).append(message)
        else:
            self._start(key, message)

    def pending(self, key: str) -> int:
        """Messages waiting for the conversation's running turn to end."""
        return len(self._pending.get(key, ()))

    def active_control(self, key: str) -> TurnControl | None:
        active = self._active.get(key)
        return None if active is None else active.control

    def announce(self, message: InboundMessage, injected: Message) -> str:
        """Heron's own message for a conversation (a subagent's result): into the running
        turn's mailbox when one runs there and still reads mail ("mail"), else a turn of its
        own opened with it ("turn"; queued behind a turn that passed its last drain)."""
        key = self.resolve(message)
        active = self._active.get(key)
        if active is not None and active.control.inject(injected):
            return "mail"
        if active is None and not self.closing:
            self._start(key, message)
        else:
            self._pending.setdefault(key, deque()).append(message)
        return "turn"

    async def answer_elsewhere(self, key: str, approval_id: str, allow: bool, by: str) -> bool:
        """A client's answer to an approval that does not wait in this process: passed on to
        where the turn runs (the workers' face, heron/scale/front.py); False here, where every
        turn runs in this loop."""
        return False

    def post_mail(self, message: InboundMessage, into: str) -> bool:
        """A worker's mail (heron/scale/): `message`, queued in its own right, for the running
        turn opened by the message with id `into`. The answer to the question that turn waits
        on (ask_user), or taken into its mailbox with the message's id when it still reads mail
        (told to the channel as "mail"), else left to its own turn ("queued"). False: that turn
        does not run here."""
        key = self.resolve(message)
        active = self._active.get(key)
        if active is None or active.message.id != into:
            return False
        question = active.control.question
        if question is not None and question.answer(message.text, message.id):
            self._event(message, key, "mail", message.text)  # the waiting run resumes (ask_user)
            return True
        taken = mailable(message) and active.control.post(message.text, message.id, message.channel)
        self._event(message, key, "mail" if taken else "queued", message.text)
        return True

    async def _turn(
        self, key: str, message: InboundMessage, control: TurnControl
    ) -> TurnResult | None:
        self._event(message, key, "turn_start", message.text)
        hooks = self._hooks(key, message, control)
        try:
            await self.relays.settled(key)
            result = await self.engine.turn(
                key, message.text, hooks, agent=message.agent, channel=message.channel
            )
        except asyncio.CancelledError:  # /stop, /new or shutdown: the channel still hears the end
            if control.visible and message_unsaved(control, message.text):  # `_stored_first`
                told = OutboundMessage(message.channel, message.chat_id, key, STOPPED_UNSAVED)
                self.bus.emit(dataclasses.replace(told, kind="notice"))  # no code: not "kept"
            self._ended(message, key, stopped_end(control))
            raise
        except Exception as error:  # a turn's failure must not take the loop down
            if not isinstance(error, HeronError):
                log.exception("turn of %s failed", key)
            lost = message_unsaved(control, message.text)
            # A failure voids the turn (`interrupted`) without naming a /stop or /new: the
            # person is told what failed all the same.
            if control.visible and control.stopped_by is None:
                said = f"The turn failed: {error}" + (f"\n{NOT_SAVED}" if lost else "")
                await self._send(message, key, said, "error")
            unusable = model_unusable(error)
            failed = TurnEnd(False, "failed", str(error), unusable=unusable, unsaved=lost)
            self._ended(message, key, failed)
            return None
        if result.switch_to:
            self.routes[(message.channel, message.chat_id)] = result.switch_to
        if result.reply is not None and not control.stale:  # RESPOND's last token check
            kind, switch_to = _kind_of(result), result.switch_to
            await self._send(message, key, result.reply, kind, switch_to=switch_to)
        self._ended(message, key, _end_of(result))
        return result

    def _ended(self, message: InboundMessage, key: str, end: TurnEnd) -> None:
        """The turn's end to its channel (when it asked for events), kept for the hooks that
        `_finished` calls once the conversation is free."""
        active = self._active.get(key)
        if active is not None and active.message is message:
            active.end = end
            # Mail the run never read opens the next turn (`_finished`): its senders are told
            # before this end, so a `heron run` waits for that turn rather than taking this
            # turn's end (another message's, maybe failed) for its own.
            for sender in active.control.mailbox.unread_senders():
                self._event(sender, key, "carried")
        self._event(message, key, "turn_end", end=end)

    def _hooks(self, key: str, message: InboundMessage, control: TurnControl) -> TurnHooks:
        """What the turn shows as it runs: busy notices always; the stream, tool calls and
        retries as TurnEvents for a channel that asked for them."""

        def notice(note: str) -> None:  # a message saved to a file, a turn left open before
            if control.visible:
                self.bus.emit(
                    OutboundMessage(message.channel, message.chat_id, key, note, "notice")
                )

        def busy(note: str) -> None:  # "busy in another session": no store soon (`stop`)
            control.settled.set()
            notice(note)

        hooks = TurnHooks(on_busy=busy, on_notice=notice, control=control)
        if control.visible:  # nobody reads a silent turn (a monitor, a subagent) to answer
            asker = self.approver_for
            found = self.approvers.get(message.channel)
            hooks.approve = found if asker is None else asker(key, message)
        if not message.events:
            return hooks

        def stream(ev: StreamEvent) -> None:
            self._event(message, key, _STREAMED.get(ev.kind, "delta"), ev.text)

        def tool_start(call: ToolCall) -> None:
            self._event(message, key, "tool_start", call=call)

        def tool_end(record: ToolCallRecord) -> None:
            took = record.ended - record.started
            self._event(message, key, "tool_end", call=record.call, result=record.result, s=took)

        def retry(error: ProviderError, wait: float) -> None:
            self._event(message, key, "retry", error.summary, s=wait)  # the hint comes last

        def saved(message_id: int) -> None:
            self._event(message, key, "saved", message_id=message_id)

        hooks.on_event, hooks.on_tool_start, hooks.on_tool_end = stream, tool_start, tool_end
        hooks.on_retry, hooks.on_saved = retry, saved
        return hooks

    def _event(
        self,
        message: InboundMessage,
        key: str,
        kind: EventKind,
        text: str = "",
        *,
        s: float = 0.0,
        call: ToolCall | None = None,
        result: ToolResult | None = None,
        end: TurnEnd | None = None,
        message_id: int | None = None,
    ) -> None:
        if message.events:
            chat = message.chat_id
            event = TurnEvent(
                message.channel,
                chat,
                key,
                kind,
                text,
                call,
                result,
                s,
                end,
                message_id,
                message.provenance,
                files=tuple(file_label(f) for f in message.files) if kind == "turn_start" else (),
            )
            self.bus.emit(event)

    def _finished(
        self,
        key: str,
        control: TurnControl,
        message: InboundMessage,
        task: asyncio.Task[TurnResult | None] | None = None,
    ) -> None:
        active = self._active.pop(key, None)
        result = None
        if task is not None and not task.cancelled() and task.exception() is None:
            result = task.result()
        # Cancelled before the turn could say so itself: it was stopped.
        end = active.end if active is not None else None
        ended = TurnEnded(key, message, end or stopped_end(control), result)
        _log_end(key, ended.end)
        if message.held and control.saved_id is None:  # told it was not kept
            self._give_up(message, key)
        queue = self._pending.setdefault(key, deque())
        mail = control.mailbox.take()
        if mail:
            # Typed after the run's last drain, or overtaken by /stop: kept, and answered next.
            queue.appendleft(unread_mail(message, mail, key))
        self.relays.release(key)  # before the next turn here (it waits)
        if self.closing:  # shutting down: what waits is kept (`close`), no turn starts
            self._keep(key, [m for m in queue if m.id is None])
            queue = self._pending[key] = deque(m for m in queue if m.id is not None)
        if queue and not self.closing:
            self._start(key, queue.popleft())
        elif not self._active:
            self._idle.set()
        if message.provenance == "user":
            self._person_at = time.monotonic()
        if not self.user_turn_running():
            self._no_person.set()
            self._person_on.clear()
        for hook in list(self.turn_end_hooks):
            try:
                hook(ended)
            except Exception:  # one hook's bug must not take the loop or the other hooks down
                log.exception("an end-of-turn hook failed for %s", key)

    async def _speak(
        self,
        control: TurnControl,
        message: InboundMessage,
        key: str,
        text: str,
        kind: OutKind = "message",
    ) -> str | None:
        """Send what the turn says to the person now; for background work, also keep it in the
        conversation it goes to. Returns what the `message` tool answers (None: its default)."""
        if control.stale:
            return None
        # Background work speaks where its user is (a monitor's job conversation), not in
        # its own silent conversation.
        to = message.meta.get("deliver_to", key)
        if to == key or kind != "message":
            # Said in the turn's own conversation: its tool call is in the record.
            await self._send(message, to, text, kind)
            return None
        who = message.meta.get("deliver_as") or f"background work ({key})"
        await self._send(message, to, text, kind, by=who)  # labelled: not this conversation's
        return await self._relay(to, Relayed(text, who, key), message.agent)

    async def _relay(self, to: str, relayed: Relayed, agent: str) -> str:
        """`relayed` kept for conversation `to` (on disk at once) and stored there: now, or
        after the turn running there (never inside it); the answer says which, and whether
        someone has `to` open to see it now."""
        kept = await self.relays.take(to, relayed, agent, turn_running=to in self._active)
        if self.attended is None:
            return f"Sent to the user and {kept}."
        if self.attended(to):
            return f"Delivered: shown to the user now, and {kept}."
        return f"Nobody has conversation {to!r} open now: {kept}, where the user sees it next."

    async def _send(
        self,
        message: InboundMessage,
        key: str,
        text: str,
        kind: str,
        code: str | None = None,
        by: str | None = None,
        switch_to: str | None = None,
    ) -> None:
        said = OutboundMessage(message.channel, message.chat_id, key, text, kind, code, by)  # type: ignore[arg-type]
        await self.bus.send(dataclasses.replace(said, switch_to=switch_to))

    # ---- interrupts -----------------------------------------------------------------------

    async def stop(self, key: str, by: str | None = None) -> bool:
        """Hard break: bump the epoch, cancel the turn, wait until it has cleaned up. `by`
        says what stopped it (`heron.bus.stopped_by`), for the turn's channel."""
        active = self._active.get(key)
        if active is None:
            return False
        await _stored_first(active)
        if self._active.get(key) is not active:  # it ended meanwhile: nothing left to stop
            return False
        active.control.void(by)
        conversation_id = active.control.token.conversation_id
        if conversation_id is not None:
            await self.engine.store.call(es.bump_epoch, self.engine.store, conversation_id, by)
        active.task.cancel()
        await asyncio.wait({active.task})
        return True

    def request_break(self, key: str) -> bool:
        """Soft break: wrap up at the next drain; a hard break if not drained in time."""
        active = self._active.get(key)
        if active is None:
            return False
        active.control.mailbox.request_break()
        loop = asyncio.get_running_loop()
        loop.call_later(self.break_grace, self._escalate, key, active)
        return True

    def _escalate(self, key: str, active: _Active) -> None:
        if self._active.get(key) is not active or active.control.mailbox.break_seen:
            return
        active.control.void()
        conversation_id = active.control.token.conversation_id
        if conversation_id is not None:  # one short write; fine on the loop
            es.bump_epoch(self.engine.store, conversation_id)
        active.task.cancel()

    async def wait_idle(self) -> None:
        """Until no turn is running or waiting (tests, shutdown)."""
        while self._active or any(self._pending.values()) or self.relays.writing:
            if not self._active and self.relays.writing:
                await self.relays.drain()
                continue
            self._idle.clear()
            await self._idle.wait()

    async def close(self, why: str = "Heron stopped") -> None:
        """Shutdown (`why` says which, to the person): no turn starts from here on; running
        turns are stopped as /stop stops them; what the person sent that no turn read (mail
        still in a mailbox, messages queued behind a turn, any message arriving now) is told
        stored in its conversation as the person's words with no answer yet, then its client
        is told it is kept (`_store_kept`), or, when the write failed, that it was not and
        to send it again: `--retry` or the next turn there answers what was kept."""
        self.closing, self._closed_by = True, why
        for key, active in list(self._active.items()):
            active.control.accepting_mail = False  # nothing more joins it: it is stopping
            mail = active.control.mailbox.take()
            self._keep(key, _senders(active.message, mail))
        for key, queue in list(self._pending.items()):
            self._keep(key, [m for m in queue if m.id is None])
            self._pending[key] = deque(m for m in queue if m.id is not None)
        for key in list(self._active):
            await self.stop(key)
        await self._store_kept()
        self._closed = True
        # What background work said, moved in before the process ends; a move that waits for
        # another process's turn is left to whoever holds that conversation next (on disk).
        await self.relays.drain(RELAY_DRAIN)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)

    def _keep(self, key: str, messages: list[InboundMessage]) -> None:
        """Messages no turn will answer before the process ends. The person's words are kept
        (stored by `_store_kept`, which tells each client once they are, or that they could
        not be); a command is not run, and says so; Heron's own (a goal's nudge, a subagent's
        result, a reminder) is started again by the next process, as after a crash (goals
        resume, owed results are announced, the schedule runs on)."""
        for message in messages:
            if message.provenance != "user":
                log.info("not started at shutdown: a %s turn of %s", message.provenance, key)
                continue
            if commands.parse(message.text) is not None:
                said = f"{self._closed_by}: {message.text.split()[0]} was not run; send it again."
                self._tell(message, key, said)
                continue
            if self._closed:  # too late to be stored with the rest
                self._give_up(message, key)
                self._tell(
                    message,
                    key,
                    f"{self._closed_by}: your message was not taken; send it again once it runs.",
                )
                continue
            self._kept.setdefault(key, []).append(message)
            self._tell(message, key, keeping_notice(self._closed_by, key), KEEPING_CODE)

    def _tell(
        self,
        message: InboundMessage,
        key: str,
        text: str,
        code: str = UNANSWERED_CODE,
        row: int | None = None,
    ) -> None:
        """Say to the client that sent `message` that no turn of this process answers it
        (`row`: the stored row that keeps it, which the notice is about)."""
        said = OutboundMessage(message.channel, message.chat_id, key, text, "notice")
        self.bus.emit(dataclasses.replace(said, code=code, message_id=row))

    async def _store_kept(self) -> None:
        """The kept words of each conversation, as one message of the person's with no answer
        yet, each sender's part labelled with its channel as mail is (`join_words`); each
        sender is told once the row is written, or, when the write failed, that its words
        were not kept. Until nothing is left: a message arriving during a write is kept
        with the next."""
        while self._kept:
            kept, self._kept = self._kept, {}
            for key, messages in kept.items():
                await self._store_words(key, messages)

    async def _store_words(self, key: str, messages: list[InboundMessage]) -> None:
        joined = join_words(messages, key)
        row: int | None = None
        try:
            caps = self.engine.settings.config.attachments
            row = await keep_words(
                self.engine.store, key, joined.text, joined.files, joined.agent, caps, joined.held
            )
        except Exception as e:  # one conversation's failed write must not lose the others
            log.exception("keeping the unanswered messages of %s failed", key)
            said = not_kept_notice(self._closed_by, key, e)
        else:
            said = ""
        for message in messages:
            kept = said or kept_notice(self._closed_by, key, message.channel)
            self._tell(message, key, kept, row=row)


async def _stored_first(active: _Active) -> None:
    """Until the message that opened the turn is stored, so a stop right behind it (the chat's
    Ctrl-C a moment after Enter, shutdown) keeps it: a turn cancelled before its commit lost
    the person's words, leaving nothing to --retry. Bounded, and not at all when the lease is
    busy in another process (its turn may run for minutes): that stop loses the message, and
    `_turn` says so."""
    control = active.control
    if control.settled.is_set() or not message_unsaved(control, active.message.text):
        return
    settled = asyncio.ensure_future(control.settled.wait())
    try:
        await asyncio.wait({settled, active.task}, timeout=STORE_WAIT_S)
    finally:
        settled.cancel()


def unread_mail(message: InboundMessage, mail: list[Unread], key: str) -> InboundMessage:
    """The mail a run never read, as the person's message of its own (`join_words`), heard
    where its first part was typed (mail posted without its message: where `message`, the
    turn's or the /new that stopped it, was). Nothing else of `message` carries over: a goal's
    nudge or a subagent's result is Heron's (its provenance, options and meta would make the
    person's words Heron's), and its id and files are its own."""
    return join_words(_senders(message, mail), key)


def _senders(message: InboundMessage, mail: list[Unread]) -> list[InboundMessage]:
    """Each unread follow-up as the person's message it came as (its channel and chat)."""
    heard = InboundMessage(
        message.channel,
        message.chat_id,
        "",
        key=message.key,
        agent=message.agent,
        events=message.events,
    )
    return [
        InboundMessage(
            (u.sender or heard).channel,
            (u.sender or heard).chat_id,
            u.text,
            key=message.key,
            agent=message.agent,
            events=(u.sender or heard).events,
            held=(u.sender or heard).held,
        )
        for u in mail
    ]


def join_words(messages: list[InboundMessage], key: str) -> InboundMessage:
    """The person's messages as one, heard where the first was typed: the words of each
    channel in turn, those from another channel than the first's labelled with theirs as mail
    is (`[sent while you were working, from web] `), so no follow-up is taken for the words of
    the client the message is heard from. Attachments of all of them come with it."""
    first = messages[0]
    parts: list[str] = []
    for message in messages:
        label = "" if message.channel == first.channel else mail_label(message.channel)
        parts.append(label + message.text)
    files = tuple(f for m in messages for f in m.files)
    return InboundMessage(
        first.channel,
        first.chat_id,
        "\n\n".join(parts),
        key,
        agent=first.agent,
        events=any(m.events for m in messages),
        files=files,
        held=tuple(row for m in messages for row in m.held),
    )


def kept_notice(why: str, key: str, channel: str = "script") -> str:
    """What a client is told of its message that no turn read before the process stopped:
    what answers it where it was typed. A page reconnects to the serve started again and
    takes `/retry`; a chat leaves with the serve, so it is told the command line."""
    answers = "/retry" if channel == "web" else f"`heron run --retry -c {key}`"
    return (
        f"{why} before your message was answered. It is kept in conversation {key!r} as "
        f"your message, with no answer yet: {answers} answers it, and the next turn there "
        "reads it."
    )


def keeping_notice(why: str, key: str) -> str:
    """What a client is told first of its message being kept (`KEEPING_CODE`)."""
    return f"{why} before your message was answered: keeping it in conversation {key!r}…"


def not_kept_notice(why: str, key: str, error: BaseException) -> str:
    """What a client is told of its message that no turn read when storing it failed."""
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (
        f"{why} before your message was answered, and keeping it in conversation {key!r} "
        f"failed ({reason}): it was not kept; send it again once Heron runs."
    )


def mailable(message: InboundMessage) -> bool:
    """Whether a message can join a running turn: mail is text, so one with attachments waits
    for a turn of its own, files and all; scheduled work never joins one."""
    return message.provenance not in NEVER_MAILED and not message.files


def stopped_end(control: TurnControl) -> TurnEnd:
    """The end of a turn a /stop, /new or signal cancelled: once its run started it is recorded
    as interrupted, and its channel is told that run's id and stop (`heron run --json` gave
    `"stop": null` and an empty `run_id`, as if no turn had run)."""
    stop = "interrupted" if control.run_id else None
    return TurnEnd(False, "stale", stopped_by=control.stopped_by, run_id=control.run_id, stop=stop)


def _end_of(result: TurnResult) -> TurnEnd:
    error = result.run.error
    return TurnEnd(
        result.ok,
        result.outcome.value,
        None if error is None else str(error),
        result.reply,
        result.command,
        result.switch_to,
        result.run_id,
        result.run.model_calls,
        result.run.usage,
        stopped_by=result.stopped_by,
        unusable=model_unusable(error),
        stop=result.run.stop,
        model_answered=result.model_answered,
        usage_unknown=result.run.usage_unknown,
    )


def _kind_of(result: TurnResult) -> str:
    if result.command and result.run.model_calls == 0:
        return "command"
    return "error" if result.run.error is not None else "answer"
