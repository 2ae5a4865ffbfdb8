"""One turn as an explicit state machine.

    RESTORE  open the conversation under its lease; close a tool phase an interrupted turn (or a
             dead process) left open, from its checkpoint; mark a crashed turn interrupted
    COMPACT  let compaction run before the turn when the engine has some pending
    COMMAND  a slash command answers without the model and goes straight to RESPOND
    BUILD    assemble the model's view and commit the user's message before any call
    RUN      the runner; a context overflow shrinks the window, compacts and runs once more
    SAVE     the commit-time check (epoch and lease); decide the outcome; drop the checkpoint
    RESPOND  hand the reply to the channel, unless the turn is stale, silent or spoke by tool
    DONE

Every step returns the next state and `TRANSITIONS` says which moves are legal, so the flow is
data a test can read. The `TurnControl` is what the outside world holds of a running turn: its
epoch token, its mailbox, a break request, and the tool-phase checkpoint it keeps.

What the machine takes and returns (`TurnHooks`, `BuiltTurn`, `TurnResult`) and what it calls of
its engine (`TurnEngine`) are defined here, so engine.py imports this module and never the
other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from heron.agent.commands import CommandEngine
from heron.agent.leases import hold_lease
from heron.agent.runner import ModelCallRecord, RunHooks, RunResult, ToolCallRecord
from heron.compaction.governor import Governor  # loaded with the engine, not in a first turn
from heron.errors import ContextOverflow
from heron.messages import Message, Text, ToolResult
from heron.store import engine_state as es

if TYPE_CHECKING:
    from heron.errors import ProviderError
    from heron.request import OnEvent
    from heron.store import Conversation
    from heron.tools.approval import Approver
    from heron.tools.registry import ToolContext


class State(enum.Enum):
    RESTORE = "restore"
    COMPACT = "compact"
    COMMAND = "command"
    BUILD = "build"
    RUN = "run"
    SAVE = "save"
    RESPOND = "respond"
    DONE = "done"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.RESTORE: frozenset({State.COMPACT}),
    State.COMPACT: frozenset({State.COMMAND}),
    State.COMMAND: frozenset({State.BUILD, State.RESPOND}),
    State.BUILD: frozenset({State.RUN}),
    State.RUN: frozenset({State.SAVE, State.RUN}),  # RUN -> RUN: retry after an overflow
    State.SAVE: frozenset({State.RESPOND}),
    State.RESPOND: frozenset({State.DONE}),
    State.DONE: frozenset(),
}


class Outcome(enum.Enum):
    DELIVERED = "delivered"  # the final answer goes to the user
    SPOKE_VIA_TOOL = "spoke_via_tool"  # the agent used `message`; the answer is not sent again
    SILENT = "silent"  # a successful turn with nothing to say
    STALE = "stale"  # /stop or /new overtook it: it emits and keeps nothing more


# Provenance of a turn; a person typing makes it visible, and so does a reminder the person
# asked for (it speaks in their conversation), an announce turn (a subagent's result, no turn
# running) and a goal's nudge; other scheduled and internal work is silent.
VISIBLE = frozenset({"user", "reminder", "announce", "goal"})
MAIL_LABEL = "[sent while you were working] "
STOPPED = "[This turn was stopped before it finished.]"
FAILED = (
    "The turn failed: {error}\nYour message is saved; send /retry to answer it again (it is "
    "not stored twice)."
)
MAX_OVERFLOW_RETRIES = 1


class Injected(Message):
    """A user-role message Heron puts into a run or opens a turn with (a subagent's result):
    stored with its `meta` (which names the run it reports) and authored by Heron, so it is
    never taken for the person's words."""

    author = "heron"

    def __init__(self, text: str, meta: dict[str, Any]) -> None:
        super().__init__("user", [Text(text)])
        object.__setattr__(self, "meta", dict(meta))


class StaleTurn(Exception):
    """Raised at a re-entry point of a turn whose epoch token is no longer current."""


@dataclass
class TurnControl:
    """A running turn as the loop and the commands see it."""

    key: str
    provenance: str = "user"
    deliver: Callable[[str], Awaitable[None]] | None = None  # the `message` tool's outlet
    conversation_id: int | None = None
    epoch: int = 0
    owner: str | None = None
    turn_id: int | None = None
    stale: bool = False
    mailbox: list[str] = field(default_factory=list)
    accepting_mail: bool = True
    break_requested: float | None = None
    break_seen: bool = False
    spoke: list[str] = field(default_factory=list)
    context_window: int | None = None  # shrunk for this run after an overflow
    calls: list[str] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    checkpointed: bool = False
    # The run's last writes, left for SAVE's transaction; given whether the turn is current.
    finish: Callable[[bool], None] | None = None
    hold_final: bool = False  # a final-looking reply waits for SAVE (`held`) to be committed
    held: list[Message] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    # heron.bus.TurnOptions of a turn Heron started (ceilings, tools, meta of its message).
    options: Any = None
    # Messages Heron injects into the run (a subagent's result), drained with the mail; stored
    # with their own meta and author.
    events: list[Message] = field(default_factory=list)
    # The question the run waits on (heron/proactive/ask.py): the next message answers it.
    question: Any = None

    @property
    def visible(self) -> bool:
        return self.provenance in VISIBLE

    async def current(self, store: Any) -> bool:
        """The token check of every commit: in memory first, then the store (another process
        may have bumped the epoch or taken the lease)."""
        if self.stale or self.conversation_id is None:
            return not self.stale
        ok = await store.call(es.still_current, store, self.conversation_id, self.epoch, self.owner)
        self.stale = not ok
        return ok

    async def settle(self, store: Any, lease: Any) -> bool:
        """SAVE's check (`current`) and the run's last writes (`finish`: the held final reply,
        trace rows, the turn row), and when the turn is current, the checkpoint dropped and the
        lease given back, all in one transaction (`es.settle_turn`)."""
        finish, self.finish = self.finish, None
        if self.stale or self.conversation_id is None or self.owner is None:
            ok = await self.current(store)
            if finish is not None:
                await store.call(finish, ok)
            return ok
        try:
            ok = await store.call(
                es.settle_turn,
                store,
                self.conversation_id,
                self.epoch,
                self.owner,
                clear_checkpoint=self.checkpointed,
                finish=finish,
            )
        except Exception:
            if finish is not None:  # rolled back: the trace rows of the calls made, at least
                with contextlib.suppress(Exception):
                    await store.call(finish, False)
            raise
        self.stale = not ok
        if ok and lease is not None:
            lease.released = True
        return ok

    def post(self, text: str) -> bool:
        """Put a follow-up in the mailbox; False once the run has passed its last drain or the
        turn was stopped (the message then waits for the next turn)."""
        if not self.accepting_mail or self.stale:
            return False
        self.mailbox.append(text)
        return True

    def inject(self, message: Message) -> bool:
        """Put a message of Heron's (a subagent's result) in the mailbox; False once the run
        has passed its last drain (it then opens a turn of its own)."""
        if not self.accepting_mail or self.stale:
            return False
        self.events.append(message)
        return True

    def take_events(self) -> list[Message]:
        events, self.events = self.events, []
        return events

    def take_mail(self) -> str:
        """The mail the run has not read, joined, and the mailbox emptied."""
        mail, self.mailbox = self.mailbox, []
        return "\n\n".join(mail)

    async def drain(self) -> list[Message]:
        mail, self.mailbox = self.mailbox, []
        events = self.take_events()
        return events + [Message("user", [Text(MAIL_LABEL + text)]) for text in mail]

    def request_break(self) -> None:
        if self.break_requested is None:
            self.break_requested = time.monotonic()

    def should_break(self) -> bool:
        if self.break_requested is None:
            return False
        self.break_seen = True
        return True


def guard_run_hooks(
    hooks: RunHooks, control: TurnControl, store: Any, ctx: ToolContext
) -> RunHooks:
    """Wrap the engine's run hooks so every re-entry point checks the turn's token, tool
    results are checkpointed as they finish, and the mailbox and break request are wired in."""
    ctx.extra["turn"] = control
    on_message, on_tool_call, on_model_call = (
        hooks.on_message,
        hooks.on_tool_call,
        hooks.on_model_call,
    )

    async def message(m: Message) -> None:
        if control.hold_final and m.role == "assistant" and not m.tool_calls:
            # A final-looking reply: SAVE commits it with the turn's last writes, after the
            # commit-time check (one commit, one check); anything the run adds after it (a
            # follow-up from the mailbox) commits it first, below.
            control.held.append(m)
            return
        if not await control.current(store):
            raise StaleTurn
        held, control.held = control.held, []
        for earlier in held:
            await on_message(earlier)
        await on_message(m)
        if m.role == "assistant" and m.tool_calls:
            control.calls, control.results = [c.id for c in m.tool_calls], []

    async def tool_call(record: ToolCallRecord) -> None:
        if not await control.current(store):
            raise StaleTurn
        await on_tool_call(record)
        control.results.append(record.result)
        await _checkpoint(control, store)

    async def model_call(record: ModelCallRecord) -> None:
        if control.stale:
            raise StaleTurn
        await on_model_call(record)

    return dataclasses.replace(
        hooks,
        on_event=_muted(hooks.on_event, control),
        on_progress=_muted(hooks.on_progress, control),
        on_message=message,
        on_tool_call=tool_call,
        on_model_call=model_call,
        drain=control.drain,
        should_break=control.should_break,
    )


def _muted(fn: Callable[[Any], None] | None, control: TurnControl) -> Callable[[Any], None] | None:
    if fn is None:
        return None

    def call(arg: Any) -> None:
        if not control.stale:
            fn(arg)

    return call


async def _checkpoint(control: TurnControl, store: Any) -> None:
    if control.conversation_id is None or control.turn_id is None:
        return
    cp = es.Checkpoint(
        control.conversation_id, control.turn_id, control.epoch, control.calls, control.results
    )
    if not await store.call(es.write_checkpoint, store, cp, control.owner):
        control.stale = True
        raise StaleTurn
    control.checkpointed = True


def muted_hooks(hooks: TurnHooks) -> TurnHooks:
    """A silent turn shows nothing: no stream, no progress, no tool pills, no retries."""
    return dataclasses.replace(
        hooks,
        on_event=None,
        on_progress=None,
        on_tool_start=None,
        on_tool_end=None,
        on_retry=None,
        on_busy=None,
        on_notice=None,
    )


@dataclass
class _Ctx:
    """What the steps of one turn share."""

    key: str
    text: str
    agent: str
    hooks: TurnHooks
    control: TurnControl
    conversation: Conversation
    dirty: bool = False  # an earlier turn left work to recover (RESTORE)
    lease: Any = None  # the held Lease: SAVE gives it back with its last writes
    built: BuiltTurn | None = None
    run: RunResult | None = None
    overflow_retries: int = 0
    answer_id: int | None = None  # /retry of a failed turn: the stored message to answer
    command: str | None = None
    switch_to: str | None = None
    reply: str | None = None
    outcome: Outcome = Outcome.DELIVERED
    trail: list[State] = field(default_factory=list)
    channel: str = "cli"  # where the message came from (the runtime block names it)


@dataclass
class TurnHooks:
    """What a channel wants to see of a turn as it happens."""

    on_event: OnEvent | None = None
    on_progress: Callable[[str], None] | None = None
    on_tool_start: Callable[..., None] | None = None
    on_tool_end: Callable[[ToolCallRecord], None] | None = None
    on_retry: Callable[[ProviderError, float], None] | None = None
    # Turn engine (heron/agent/turn.py): told once when another session holds the conversation;
    # the running turn's control (epoch token, mailbox, break); who started the turn.
    on_busy: Callable[[str], None] | None = None
    # Told once what the turn did to what the person sent (a message too large for the model's
    # share of the window, saved to a file).
    on_notice: Callable[[str], None] | None = None
    control: TurnControl | None = None
    # Asks the person before an unconfined command runs (the channel's, through the AgentLoop);
    # None: the engine's default (`Engine.approve`), else "ask" refuses.
    approve: Approver | None = None


@dataclass
class BuiltTurn:
    """What BUILD hands to RUN: the turn's ids, the system prompt and the model-facing view."""

    run_id: str
    turn_id: int
    system: str
    messages: list[Message]
    # Compaction (heron/compaction): derives the view again before every model call.
    governor: Governor | None = None
    # Compaction's own model calls (summaries, checkpoints), held until RUN records them.
    compaction_calls: CallSink = field(default_factory=lambda: CallSink())
    notices: list[str] = field(default_factory=list)  # told to the user once (a large message)


@dataclass
class TurnResult:
    conversation: Conversation
    run_id: str
    run: RunResult
    system_fingerprint: str
    extra: dict = field(default_factory=dict)
    # Turn engine: how the turn ended for the user, what to show them (None: nothing),
    # the slash command that answered it, and the states it went through.
    outcome: Outcome = Outcome.DELIVERED
    reply: str | None = None
    command: str | None = None
    switch_to: str | None = None  # /resume: the channel continues in this conversation
    states: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.run.text

    @property
    def ok(self) -> bool:
        return self.run.stop in ("done", "wrapup", "length", "repetition")


class CallSink:
    """Where compaction hands its model calls for a turn: held until the turn's recorder is
    attached (a consolidation at BUILD comes before it), then passed on as they happen."""

    def __init__(self) -> None:
        self.held: list[ModelCallRecord] = []
        self.target: Callable[[ModelCallRecord], Awaitable[None]] | None = None

    async def __call__(self, record: ModelCallRecord) -> None:
        if self.target is None:
            self.held.append(record)
        else:
            await self.target(record)

    async def attach(self, target: Callable[[ModelCallRecord], Awaitable[None]]) -> None:
        self.target = target
        held, self.held = self.held, []
        for record in held:
            await target(record)

    def detach(self) -> None:
        self.target = None


class TurnEngine(CommandEngine, Protocol):
    """What the turn machine calls of its engine (heron/agent/engine.py): the steps' bodies."""

    async def compact_before_turn(self, conversation: Conversation) -> None: ...

    async def compact_now(
        self,
        conversation: Conversation,
        *,
        reason: str = "manual",
        window: int | None = None,
        on_call: CallSink | None = None,
    ) -> str: ...

    async def _restore(self, key: str, agent: str) -> Conversation: ...

    async def _build(
        self,
        conversation: Conversation,
        text: str,
        agent: str,
        *,
        channel: str = "cli",
        answer: int | None = None,
    ) -> BuiltTurn: ...

    async def _run(
        self, conversation: Conversation, built: BuiltTurn, hooks: TurnHooks
    ) -> RunResult: ...


class TurnMachine:
    """Drives one turn through the states; the engine supplies restore, build and run."""

    def __init__(self, engine: TurnEngine) -> None:
        self.engine = engine
        self.store = engine.store
        self.steps: dict[State, Callable[[_Ctx], Awaitable[State]]] = {
            State.RESTORE: self.restore,
            State.COMPACT: self.compact,
            State.COMMAND: self.command,
            State.BUILD: self.build,
            State.RUN: self.run_step,
            State.SAVE: self.save,
            State.RESPOND: self.respond,
        }

    async def turn(
        self, key: str, text: str, hooks: TurnHooks, agent: str, channel: str = "cli"
    ) -> TurnResult:
        control = hooks.control or TurnControl(key)
        hooks = dataclasses.replace(hooks, control=control)
        if not control.visible:
            hooks = muted_hooks(hooks)
        conversation = await self.engine._restore(key, agent)
        control.conversation_id = conversation.id
        early = await self._lease_free_command(key, text, agent, conversation)
        if early is not None:
            return early
        async with hold_lease(self.store, conversation.id, on_busy=hooks.on_busy) as lease:
            control.owner, control.epoch = lease.owner, lease.epoch
            c = _Ctx(key, text, agent, hooks, control, conversation, lease.dirty, lease)
            c.channel = channel
            try:
                await self._drive(c)
            except (asyncio.CancelledError, Exception):
                await asyncio.shield(self._interrupted(c))
                raise
        return self._result(c)

    async def _lease_free_command(
        self, key: str, text: str, agent: str, conversation: Conversation
    ) -> TurnResult | None:
        """/stop and /status must not wait behind the turn they are about; /new first makes
        any running turn stale so the lease comes free at its next commit."""
        from heron.agent import commands

        found = commands.parse(text)
        if found is None:
            return None
        if found.name == "new":
            await self.store.call(es.bump_epoch, self.store, conversation.id)
            return None
        if found.name not in commands.LEASE_FREE:
            return None
        reply = await commands.run(found, commands.CommandContext(self.engine, key, agent))
        c = _Ctx(key, text, agent, TurnHooks(), TurnControl(key), conversation)
        c.command, c.reply, c.trail = found.name, reply.text, [State.COMMAND, State.RESPOND]
        return self._result(c)

    async def _drive(self, c: _Ctx) -> None:
        state = State.RESTORE
        while state is not State.DONE:
            c.trail.append(state)
            nxt = await self.steps[state](c)
            if nxt not in TRANSITIONS[state]:
                raise RuntimeError(f"illegal turn transition {state.name} -> {nxt.name}")
            state = nxt
        c.trail.append(State.DONE)

    # ---- states ---------------------------------------------------------------------------

    async def restore(self, c: _Ctx) -> State:
        if c.dirty:
            await self.store.call(_recover, self.store, c.conversation.id)
        return State.COMPACT

    async def compact(self, c: _Ctx) -> State:
        await self.engine.compact_before_turn(c.conversation)
        return State.COMMAND

    async def command(self, c: _Ctx) -> State:
        from heron.agent import commands

        found = commands.parse(c.text)
        if found is None:
            return State.BUILD
        c.command = found.name
        ctx = commands.CommandContext(self.engine, c.key, c.agent)
        reply = await commands.run(found, ctx)
        c.switch_to = reply.switch_to
        if reply.run_text is not None:  # /retry, /edit: the head moved; answer this text
            c.text, c.answer_id = reply.run_text, reply.answer_id
            return State.BUILD
        c.reply = reply.text
        return State.RESPOND

    async def build(self, c: _Ctx) -> State:
        options = c.control.options
        c.built = await self.engine._build(
            c.conversation,
            c.text,
            c.agent,
            channel=c.channel,
            answer=c.answer_id,
            meta=getattr(options, "message_meta", None),
            bare=getattr(options, "bare", False),
            provenance=c.control.provenance,
        )
        c.control.turn_id = c.built.turn_id
        return State.RUN

    async def run_step(self, c: _Ctx) -> State:
        assert c.built is not None
        try:
            c.run = await self.engine._run(c.conversation, c.built, c.hooks)
        except StaleTurn:
            c.run = RunResult([], "interrupted")
            return State.SAVE
        finally:
            c.control.accepting_mail = False
        if isinstance(c.run.error, ContextOverflow) and c.overflow_retries < MAX_OVERFLOW_RETRIES:
            c.overflow_retries += 1
            finish, c.control.finish = c.control.finish, None
            if finish is not None:  # the failed run's rows go before the retry makes its own
                await self.store.call(finish, True)
            await self._recover_overflow(c)
            c.control.accepting_mail = True
            return State.RUN
        return State.SAVE

    async def save(self, c: _Ctx) -> State:
        assert c.run is not None
        if not await c.control.settle(self.store, c.lease):
            c.outcome = Outcome.STALE
            await self._mark(c, "interrupted", "stale")
            return State.RESPOND
        if c.run.error is not None:
            c.reply = FAILED.format(error=c.run.error)
        elif c.control.spoke:
            c.outcome = Outcome.SPOKE_VIA_TOOL
        elif not c.run.text.strip():
            c.outcome = Outcome.SILENT
        else:
            c.reply = c.run.text
        return State.RESPOND

    async def respond(self, c: _Ctx) -> State:
        if c.outcome is Outcome.STALE or c.control.stale:
            c.outcome, c.reply = Outcome.STALE, None
        elif not c.control.visible and c.command is None:
            # Internal work speaks only through `message`; its answer and errors stay in the record.
            c.reply = None
            c.outcome = Outcome.SPOKE_VIA_TOOL if c.control.spoke else Outcome.SILENT
        if c.reply is not None and c.outcome is Outcome.SILENT:
            c.outcome = Outcome.DELIVERED
        return State.DONE

    # ---- helpers --------------------------------------------------------------------------

    async def _recover_overflow(self, c: _Ctx) -> None:
        """Shrink the window for this run, compact, and build the turn's context again as BUILD
        does: the system prompt (with the new summary), the view and the governor, all for the
        smaller window. Compaction's calls go in the turn's trace and usage."""
        from heron.compaction import prepare_turn
        from heron.compaction.core import window_for

        built = c.built
        assert built is not None and built.governor is not None
        window = window_for(self.engine, c.control.context_window)
        c.control.context_window = int(window * 0.75)
        calls = built.compaction_calls
        await self.engine.compact_now(
            c.conversation, reason="overflow", window=window, on_call=calls
        )
        prepared = await prepare_turn(
            self.engine,
            c.conversation,
            c.agent,
            built.turn_id,
            built.governor.anchor_id,
            window=c.control.context_window,
            on_call=calls,
        )
        c.built = dataclasses.replace(
            built, system=prepared.system, messages=prepared.messages, governor=prepared.governor
        )

    async def _mark(self, c: _Ctx, status: str, stop: str) -> None:
        if c.built is None:
            return
        await self.store.call(_mark_turn, self.store, c.built.turn_id, status, stop)

    async def _interrupted(self, c: _Ctx) -> None:
        """A hard break or a failure inside the machine: record the turn as interrupted and
        leave the record whole (finished tool results restored, a minimal stopped reply)."""
        c.control.stale = True
        c.control.accepting_mail = False
        finish, c.control.finish = c.control.finish, None
        if finish is not None:  # a run that ended before SAVE: its trace rows, not its reply
            await self.store.call(finish, False)
        if c.built is not None:
            await self.store.call(_close_turn, self.store, c.conversation.id, c.built.turn_id)

    def _result(self, c: _Ctx) -> TurnResult:
        from heron.context.prompt import fingerprint

        run = c.run or RunResult([Message("assistant", [Text(c.reply or "")])], "done")
        built = c.built
        return TurnResult(
            c.conversation,
            built.run_id if built else "",
            run,
            fingerprint(built.system) if built else "",
            outcome=c.outcome,
            reply=c.reply,
            command=c.command,
            switch_to=c.switch_to,
            states=[s.name for s in c.trail],
        )


def _recover(store: Any, conversation_id: int) -> None:
    """Under the lease: turns still marked running were left by a dead process; close them."""
    rows = store.query(
        "SELECT id FROM turns WHERE conversation_id = ? AND status = 'running'",
        (conversation_id,),
    )
    for row in rows:
        _close_turn(store, conversation_id, row[0])
    if es.needs_closing(store, conversation_id):
        es.close_dangling_calls(store, conversation_id)


def _mark_turn(store: Any, turn_id: int, status: str, stop: str) -> None:
    with store.transaction() as c:
        c.execute(
            "UPDATE turns SET status = ?, stop_reason = ?, ended = ? WHERE id = ?",
            (status, stop, time.time(), turn_id),
        )


def _close_turn(store: Any, conversation_id: int, turn_id: int) -> None:
    """Record an interrupted turn minimally, so the next turn sees the stopped exchange."""
    with store.transaction() as c:
        es.close_dangling_calls(store, conversation_id)
        head_id = store.conversation_by_id(conversation_id).head_id
        head = store.message(head_id) if head_id is not None else None
        if head is not None and head.turn_id == turn_id and head.role == "user":
            store.append(
                conversation_id,
                Message("assistant", [Text(STOPPED)]),
                turn_id=turn_id,
                meta={"interrupted": True},
            )
        c.execute(
            "UPDATE turns SET status = 'interrupted', stop_reason = COALESCE(stop_reason,"
            " 'break_hard'), ended = COALESCE(ended, ?) WHERE id = ? AND status = 'running'",
            (time.time(), turn_id),
        )
