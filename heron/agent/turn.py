"""One turn, top to bottom: the state machine and the body of every step.

    RESTORE  under the conversation's lease: close what an interrupted turn (or a dead
             process) left open, from its checkpoint
    COMMAND  a slash command answers without the model (-> RESPOND); /retry and /edit move the
             head and hand BUILD the text to answer
    BUILD    commit the user's message before any model call, then derive the model's view
    RUN      the runner, with the hooks that record, check the epoch token, checkpoint tool
             results and read the mailbox; a context overflow compacts and runs once more
    SAVE     one transaction: the commit-time check, then the final reply, the trace rows held
             and the turn row; decides the outcome
    RESPOND  what the channel shows: the reply, or nothing (stale, silent, spoke via tool)

There is no COMPACT state: compaction happens inside BUILD (a consolidation, when the
conversation outgrew its share of the window, in `prepare_turn`) and inside RUN (in flight,
before each model call, by the governor; and after an overflow).

Each step is `async def step(turn, previous) -> Next`, where `Next` is a small frozen
dataclass whose `next` names the state it leads to (`Restored` -> COMMAND, `Answered` ->
RESPOND, ...). `TRANSITIONS` is derived from the steps' return annotations, so the legal moves
are what the code says, and the driver refuses any other. RUN hands SAVE a `PendingSave` (the
final reply, the trace rows its recorder holds, the turn's figures) instead of parking
callables on shared state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import os
import re
import secrets
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from heron import timefmt
from heron.agent import commands
from heron.agent.control import StaleTurn, TurnControl, held_rows
from heron.agent.leases import Lease, hold_lease, left_message, watch_epoch
from heron.agent.record import CallSink, TurnFigures, TurnRecorder
from heron.agent.runner import (
    HeronPrompt,
    RunHooks,
    RunLimits,
    Runner,
    RunResult,
    ToolCallRecord,
    stopped_record,
)
from heron.agent.tracing import trace_for
from heron.attachments import Composed, compose, without_keys
from heron.bus import TurnOptions, stopped_by
from heron.compaction import compact_conversation, prepare_turn
from heron.compaction.consolidate import CompactionReport
from heron.compaction.core import output_for, window_for
from heron.compaction.governor import Governor  # loaded with the engine, not in a first turn
from heron.context.prompt import fingerprint
from heron.context.runtime import RuntimeInfo, with_runtime
from heron.errors import ContextOverflow, ProviderError, StoreRefused
from heron.memory import wiring as memory_wiring
from heron.messages import File, Message, Text, scrub_text, title_of
from heron.providers.base import RetryPolicy
from heron.providers.overflow import window_setting
from heron.providers.wire import ModelCallRecord
from heron.redact import Redactor
from heron.request import OnEvent, StreamEvent
from heron.store import Conversation, Store, attempts, held, waiting
from heron.store import engine_state as es
from heron.tools.context import Approver, ToolContext, TurnServices
from heron.tools.python_kernel import KernelKey
from heron.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from heron.agent.deps import TurnDeps
    from heron.trace.recorder import TraceRecorder


class State(enum.Enum):
    RESTORE = "restore"
    COMMAND = "command"
    BUILD = "build"
    RUN = "run"
    SAVE = "save"
    RESPOND = "respond"
    DONE = "done"


class Outcome(enum.Enum):
    DELIVERED = "delivered"  # the final answer goes to the user
    SPOKE_VIA_TOOL = "spoke_via_tool"  # the agent used `message`; the answer is not sent again
    SILENT = "silent"  # a successful turn with nothing to say
    STALE = "stale"  # /stop or /new overtook it: it emits and keeps nothing more


STOPPED = "[This turn was stopped before it finished.]"
REPLY_STOPPED = "[The reply was stopped here.]"  # after the part of a reply the person saw
# What stopped a turn whose epoch another process bumped without saying why (an older Heron).
ELSEWHERE = "/stop or /new from another session"
FAILED = (
    "The turn failed: {error}\nYour message is saved; send /retry to answer it again (it is "
    "not stored twice)."
)
# A failed turn Heron opened itself: there is no message of the person's to answer again. (A
# scheduled job's failed run shows none: the scheduler says it once per failing streak.)
HERON_FAILED = "Heron opened this turn itself ({opened}); nothing you wrote is lost."


def failed_note(error: str, opened: str = "user") -> str:
    """What the person is told of a failed turn, live and from its turn row after a reload:
    /retry for their own message; for a turn Heron opened (`opened`: its provenance), that
    nothing of theirs is lost."""
    if opened == "user":
        return FAILED.format(error=error)
    return f"The turn failed: {error}\n{HERON_FAILED.format(opened=opened)}"


# Said with the error of a turn that failed before the person's message was stored.
NOT_SAVED = "Your message was not saved: send it again once this is fixed."
# A context overflow is retried twice: at the window the server stated, then a quarter
# smaller (Heron's estimate of the prompt fell short of the server's count), or a quarter
# smaller each time when the server stated none.
MAX_OVERFLOW_RETRIES = 2
OVERFLOW_SHRINK = 0.75  # the window of the run after an overflow, as a share of the last one
# A goal's turn: no wall-clock deadline on a model request (the stall timeout still cuts a
# silent stream); a year, not infinity, so the timer arithmetic stays finite.
NO_DEADLINE = 365 * 24 * 3600.0


class Injected(Message):
    """A user-role message Heron puts into a run or opens a turn with (a subagent's result):
    stored with its `meta` (which names the run it reports) and authored by Heron, so it is
    never taken for the person's words."""

    author = "heron"

    def __init__(self, text: str, meta: dict[str, Any]) -> None:
        super().__init__("user", [Text(text)])
        object.__setattr__(self, "meta", dict(meta))


# ---- what a channel hands in and gets back ----------------------------------------------------


@dataclass
class TurnHooks:
    """What a channel wants to see of a turn as it happens."""

    on_event: OnEvent | None = None
    on_progress: Callable[[str], None] | None = None
    on_tool_start: Callable[..., None] | None = None
    on_tool_end: Callable[[ToolCallRecord], None] | None = None
    on_retry: Callable[[ProviderError, float], None] | None = None
    # Told once when another session holds the conversation ("busy in another session").
    on_busy: Callable[[str], None] | None = None
    # Told once the message the turn answers is in the store, with its row's id (a command
    # that answers nothing itself never calls it).
    on_saved: Callable[[int], None] | None = None
    # Told once what the turn did to what the person sent (a message too large for the model's
    # share of the window, saved to a file).
    on_notice: Callable[[str], None] | None = None
    # The running turn's epoch token, mailbox and checkpoint (heron/agent/control.py).
    control: TurnControl | None = None
    # Asks the person before an unconfined command runs (the channel's, through the AgentLoop);
    # None: the engine's default (`Engine.approve`), else "ask" refuses.
    approve: Approver | None = None


@dataclass
class TurnResult:
    conversation: Conversation
    run_id: str
    run: RunResult
    system_fingerprint: str
    # How the turn ended for the user, what to show them (None: nothing), the slash command
    # that answered it, and the states it went through.
    outcome: Outcome = Outcome.DELIVERED
    reply: str | None = None
    command: str | None = None
    switch_to: str | None = None  # /resume: the channel continues in this conversation
    states: list[str] = field(default_factory=list)
    stopped_by: str | None = None  # STALE: what stopped it, when known (heron.bus.stopped_by)
    model_answered: bool = False  # the command's maintenance calls answered (CommandReply)

    @property
    def text(self) -> str:
        return self.run.text

    @property
    def ok(self) -> bool:
        """Answered: not failed, and not stopped by /stop or /new (whatever streamed first)."""
        stopped = self.outcome is Outcome.STALE
        return not stopped and self.run.stop in ("done", "wrapup", "length", "repetition")


# ---- the steps' results: each names the state it leads to -------------------------------------


@dataclass(frozen=True)
class Restored:
    next: ClassVar[State] = State.COMMAND


@dataclass(frozen=True)
class ToBuild:
    """The text to answer; `answer_id`: a stored message answered where it stands (/retry of a
    failed turn), not stored again."""

    next: ClassVar[State] = State.BUILD
    text: str
    answer_id: int | None = None


@dataclass(frozen=True)
class Answered:
    """A slash command's answer; the model is not called."""

    next: ClassVar[State] = State.RESPOND
    reply: str | None
    outcome: Outcome = Outcome.DELIVERED


@dataclass(frozen=True)
class BuiltTurn:
    """What BUILD hands to RUN: the turn's ids, the system prompt and the model-facing view."""

    next: ClassVar[State] = State.RUN
    run_id: str
    turn_id: int
    system: str
    messages: list[Message]
    governor: Governor | None = None  # derives the view again before every model call
    # Compaction's own model calls (summaries, checkpoints), held until RUN records them.
    compaction_calls: CallSink = field(default_factory=CallSink)
    notices: list[str] = field(default_factory=list)  # told to the user once (a large message)
    user_message_id: int | None = None  # the message the turn answers: the run's first row


@dataclass(frozen=True)
class RunAgain:
    """After a context overflow: the context built again for a smaller window."""

    next: ClassVar[State] = State.RUN
    built: BuiltTurn
    window: int  # tokens, for the rest of this turn
    retries: int  # overflows retried so far
    earlier: TurnFigures  # what the runs before spent: the turn row counts them too


@dataclass(frozen=True)
class PendingSave:
    """What RUN leaves for SAVE's one transaction: the final reply held since the model
    answered, the recorder whose trace rows are still held, and the turn row's figures."""

    next: ClassVar[State] = State.SAVE
    run: RunResult
    final: tuple[Message, ...]
    figures: TurnFigures
    recorder: TurnRecorder

    def write(self, current: bool) -> None:
        self.recorder.commit_last_writes(self.final, self.figures, current)


@dataclass(frozen=True)
class Saved:
    next: ClassVar[State] = State.RESPOND
    reply: str | None
    outcome: Outcome


@dataclass(frozen=True)
class Done:
    """What the channel is handed (None: nothing) and how the turn ended for the user."""

    next: ClassVar[State] = State.DONE
    reply: str | None
    outcome: Outcome


# ---- one turn ---------------------------------------------------------------------------------


@dataclass
class Turn:
    """What the steps of one turn share: what it was given, and what its result reports."""

    engine: TurnDeps
    key: str
    text: str
    agent: str
    channel: str  # where the message came from (the runtime block names it)
    hooks: TurnHooks
    control: TurnControl
    conversation: Conversation
    lease: Lease | None = None
    command: str | None = None
    switch_to: str | None = None
    model_answered: bool = False  # the command's maintenance calls answered
    built: BuiltTurn | None = None
    run: RunResult | None = None
    pending: PendingSave | None = None  # between RUN and SAVE
    trail: list[State] = field(default_factory=list)
    partial: str = ""  # reply text streamed to the channel since the last message committed
    stopped_elsewhere: bool = False  # cancelled by `stops_elsewhere`, not by its AgentLoop
    # By call id, what a tool stopped with the turn had produced (`ToolContext.leave_partial`):
    # said with its interrupted result.
    stopped_output: dict[str, str] = field(default_factory=dict)


async def run_turn(
    engine: TurnDeps, key: str, text: str, hooks: TurnHooks, agent: str, channel: str
) -> TurnResult:
    """One user message under the conversation's lease, RESTORE to RESPOND."""
    control = hooks.control or TurnControl(key)
    hooks = dataclasses.replace(hooks, control=control)
    if not control.visible:
        hooks = muted_hooks(hooks)
    store = engine.store
    existed = await store.call(store.conversation, key)
    conversation: Conversation = (
        existed if existed is not None else await store.call(store.open_conversation, key, agent)
    )
    control.token.conversation_id = conversation.id
    t = Turn(engine, key, text, agent, channel, hooks, control, conversation)
    result = await _under_lease(t)
    if existed is None and result.command is not None:
        # A command on a new key (/status, --retry with nothing to retry) said something
        # and stored nothing: it leaves no empty conversation behind.
        await store.call(store.drop_if_empty, conversation.id)
    return result


async def _under_lease(t: Turn) -> TurnResult:
    early = await lease_free_command(t)
    if early is not None:
        return early
    store, control, hooks = t.engine.store, t.control, t.hooks
    async with hold_lease(store, t.conversation.id, on_busy=hooks.on_busy) as lease:
        control.token.owner, control.token.epoch = lease.owner, lease.epoch
        t.lease = lease
        if lease.left_by is not None and hooks.on_notice is not None:
            hooks.on_notice(left_message(lease.left_by))
        try:
            async with stops_elsewhere(t, lease):
                done = await drive(t)
        except asyncio.CancelledError:
            await asyncio.shield(interrupted(t))
            if not (t.stopped_elsewhere and _uncancelled()):
                raise
            done = Done(None, Outcome.STALE)  # stopped as /stop stops it, and said so
        except Exception:
            await asyncio.shield(interrupted(t))
            raise
    return result_of(t, done)


@contextlib.asynccontextmanager
async def stops_elsewhere(t: Turn, lease: Lease) -> AsyncIterator[None]:
    """/stop or /new from another process bumps the stored epoch: the turn notices within
    `EPOCH_POLL` (heron/agent/leases.py) and is stopped as the AgentLoop's /stop stops it (the
    task cancelled, `interrupted` keeping what finished and what streamed), then ends STALE
    with what stopped it instead of raising. Without the watch it would stream on to its end
    and only SAVE would find it stale."""
    task = asyncio.current_task()
    watching = True

    def moved(by: str | None) -> None:
        if watching and task is not None and not t.control.stale:  # stopped here already
            t.control.void(by or ELSEWHERE)
            t.stopped_elsewhere = True
            task.cancel()

    async with watch_epoch(t.engine.store, t.conversation.id, lease.epoch, moved):
        try:
            yield
        finally:
            watching = False


def _uncancelled() -> bool:
    """Take back the watch's own cancel of this task; False when something else cancelled it
    too (the AgentLoop's /stop, a shutdown), which must go on."""
    task = asyncio.current_task()
    return task is not None and task.uncancel() == 0


async def lease_free_command(t: Turn) -> TurnResult | None:
    """/stop and /status must not wait behind the turn they are about; /new first makes any
    running turn stale so the lease comes free at its next commit."""
    found = commands.parse(t.text)
    if found is None:
        return None
    store = t.engine.store
    if found.name == "new":
        by = stopped_by("new", t.channel, os.getpid())  # read by a turn of another process
        await store.call(es.bump_epoch, store, t.conversation.id, by)
        return None
    if found.name not in commands.LEASE_FREE:
        return None
    context = commands.CommandContext(t.engine, t.key, t.agent, channel=t.channel)
    reply = await commands.run(found, context)
    t.command, t.trail = found.name, [State.COMMAND, State.RESPOND]
    return result_of(t, Done(reply.text, Outcome.DELIVERED))


Step = Callable[[Turn, Any], Awaitable[Any]]


async def drive(t: Turn) -> Done:
    """Run the steps from RESTORE until DONE, refusing any move the table does not allow."""
    state, result = State.RESTORE, None
    while state is not State.DONE:
        t.trail.append(state)
        result = await STEPS[state](t, result)
        nxt = type(result).next
        if nxt not in TRANSITIONS[state]:
            raise RuntimeError(f"illegal turn transition {state.name} -> {nxt.name}")
        state = nxt
    t.trail.append(State.DONE)
    assert isinstance(result, Done)
    return result


# ---- RESTORE ----------------------------------------------------------------------------------


async def restore(t: Turn, _: None) -> Restored:
    """The lease claim read whether an earlier turn left work open (`Lease.dirty`); then what
    the person sent a process that died before storing it (mail, a queued message:
    heron/store/held.py), and what background work said here that still waits
    (heron/store/waiting.py: its process died before it moved it in, or another process's move
    waits for this lease), go in before the history is read. A recovered workflow continues
    its own turn: no stop marker, and nothing goes in inside it (what waits goes in after it)."""
    store = t.engine.store
    if resumed(t) is not None:
        await store.call(attempts.close_for_resume, store, t.conversation.id)
        return Restored()
    if t.lease is not None and t.lease.dirty:
        await store.call(es.recover, store, t.conversation.id, STOPPED)
    await store.call(held.move_left, store, t.key, t.conversation.id)
    await store.call(waiting.move_all, store, t.key, t.conversation.id)
    return Restored()


def resumed(t: Turn) -> int | None:
    """The stored message a recovered turn answers where the record stands (heron/scale/)."""
    return resumed_id(t.control)


# ---- COMMAND ----------------------------------------------------------------------------------


async def command(t: Turn, _: Restored) -> ToBuild | Answered:
    answer_id = resumed(t)
    if answer_id is not None:
        return ToBuild(t.text, answer_id)
    found = commands.parse(t.text)
    if found is None:
        return ToBuild(t.text)
    t.command = found.name
    context = commands.CommandContext(t.engine, t.key, t.agent, channel=t.channel)
    reply = await commands.run(found, context)
    t.switch_to, t.model_answered = reply.switch_to, reply.model_answered
    if reply.run_text is not None:  # /retry, /edit: the head moved; answer this text
        return ToBuild(reply.run_text, reply.answer_id)
    return Answered(reply.text)


# ---- BUILD ------------------------------------------------------------------------------------


async def build(t: Turn, todo: ToBuild) -> BuiltTurn:
    """Commit the user's message (with the runtime block it is sent with) before any call,
    compact if the conversation outgrew its share of the window, and derive the view."""
    engine, store = t.engine, t.engine.store
    options = t.control.options
    run_id = (options.run_id if options is not None else None) or f"run_{secrets.token_hex(8)}"
    if todo.answer_id is None:
        text = await fresh_start(t, todo.text)
        turn_id, user_id = await commit_message(t, run_id, text)
    else:
        turn_id = await store.call(
            store.start_turn,
            t.conversation.id,
            run_id,
            user_message_id=todo.answer_id,
            provider=engine.choice.provider,
            model=engine.choice.model,
        )
        user_id = todo.answer_id
        await store.call(ask_again, store, t.conversation.id, turn_id)
    t.control.saved_id, t.control.run_id = user_id, run_id
    t.control.settled.set()
    if t.hooks.on_saved is not None:
        t.hooks.on_saved(user_id)
    t.control.checkpoint.turn_id = turn_id
    sink = CallSink()
    heavy = bool(t.control.files)
    prepared = await prepare_turn(
        engine, t.conversation, t.agent, turn_id, user_id, heavy=heavy, on_call=sink
    )
    t.built = BuiltTurn(
        run_id,
        turn_id,
        prepared.system,
        prepared.messages,
        prepared.governor,
        sink,
        [*prepared.notices, *no_tools_note(t, todo.text)],
        user_id,
    )
    return t.built


# Words of a message that asks the agent to act on the machine: run something, read a file.
_TOOL_WORDS = re.compile(
    r"\b(tools?|bash|shell|terminal|commands?|run_cell|execute|scripts?|files?|folders?|"
    r"director(?:y|ies)|workspace)\b",
    re.IGNORECASE,
)


def asks_for_tools(text: str) -> bool:
    """Whether the person's message reads as a request to use a tool (a guess by its words:
    a note said once too often costs a line; the one never said cost a made-up command)."""
    return _TOOL_WORDS.search(text) is not None


def no_tools_note(t: Turn, text: str) -> list[str]:
    """A model offered no tools, asked by the person to use one, would write a command as
    text that looks run: it is said, once per conversation in this process, that it cannot."""
    engine = t.engine
    told = engine.memos.told_no_tools
    if engine.registry.names() or t.control.options is not None or t.conversation.id in told:
        return []  # tools there, or a turn Heron started (a job, a goal): nobody asked
    if not asks_for_tools(text):
        return []
    told.add(t.conversation.id)
    choice = engine.choice
    if choice.embedded:
        return [
            "The offline demo model cannot use tools: it runs no command and reads no file, "
            "so a command it writes is only text. For tools, point Heron at a real model "
            '(README, "Pointing Heron at a model").'
        ]
    return [
        f"{choice.model} cannot use tools here (it is offered none): it runs no command and "
        "reads no file, so a command it writes is only text. If it can call tools, "
        f'tools = true under [models."{choice.model}"] in config.toml offers them.'
    ]


# Heron's line after a stopped reply whose message `heron run --retry` answers where it stands:
# the request then ends on the person's side, not on the stopped reply (a wire such as
# Anthropic's would read a last assistant message as a start to continue, or refuse it).
ASKED_AGAIN = (
    "[Asked again: answer the message above; the reply to it was stopped before it finished.]"
)


def ask_again(store: Store, conversation_id: int, turn_id: int) -> None:
    """Before a stored message is answered where it stands: when the branch ends with a reply
    (the interrupted one a /stop or a crash left), Heron's `ASKED_AGAIN` follows it, in the
    new turn. A failed turn's branch ends with the message or its tool results: nothing."""
    head_id = store.conversation_by_id(conversation_id).head_id
    head = store.message(head_id) if head_id is not None else None
    if head is not None and head.role == "assistant" and not head.message.tool_calls:
        store.append(conversation_id, HeronPrompt(ASKED_AGAIN), turn_id=turn_id)


# What the first message after a fresh start says of the check before it (`fresh_start`).
CARRIED = "[Your previous check, {when}, ended: {note}]"
CARRIED_CHARS = 1_000  # a closing note is a short line; a long one is cut, the tail stays small


async def fresh_start(t: Turn, text: str) -> str:
    """A turn of repeated background checks (`TurnOptions.fresh_after`: a monitor, the
    heartbeat): once its conversation holds that many turns since its last separator, a new one
    is written before the message (under this turn's lease, so never inside another turn's
    rows), and the message carries how the last check ended: a check that compares with what it
    found before ("tell me when the build turns red") loses nothing its model needs."""
    options = t.control.options
    if options is None or options.fresh_after is None:
        return text
    store = t.engine.store
    after, mark = options.fresh_after, commands.SEPARATOR
    note = await store.call(es.fresh_start, store, t.conversation.id, after, mark)
    if note is None or not note.text:
        return text
    when = timefmt.when(note.ended, t.engine.settings.timezone)
    said = " ".join(note.text.split())
    if len(said) > CARRIED_CHARS:
        said = said[: CARRIED_CHARS - 1] + "…"
    return f"{text}\n\n{CARRIED.format(when=when, note=said)}"


async def commit_message(t: Turn, run_id: str, text: str) -> tuple[int, int]:
    """Auto-recall, then the user's message with its turn row, in one commit. The TurnOptions
    of a turn Heron started may give the message's `meta` (a subagent's result or task,
    authored by Heron) and make it `bare` (no auto-recall, no runtime notes: a subagent is
    blind to the conversations by design); a provenance other than the person's marks it
    Heron's, and gets no auto-recall either (`searched`)."""
    engine, store, conversation = t.engine, t.engine.store, t.conversation
    options, provenance = t.control.options, t.control.provenance
    meta = options.message_meta if options is not None else None
    text, _ = scrub_text(text)  # a channel that let undecodable bytes through: U+FFFD
    files = t.control.files
    composed = person_parts(engine, text, files)
    user_message = Message("user", composed.parts)
    bare = options is not None and options.bare
    search = searched(provenance) and offers_recall(t)
    note = None if bare else await recall_and_note(t, text, search)
    zone = engine.settings.timezone  # the one jobs are read in, and every time shown
    # A turn Heron opened (a goal's nudge, a subagent's result, a reminder) came from no
    # channel the person typed in: the model is told whose it is, not the client's name.
    channel = t.channel if provenance == "user" else f"heron ({provenance})"
    info = RuntimeInfo(channel, conversation.key, zone, note=note)
    profile = engine.choice.profile
    begin = functools.partial(
        store.begin_turn,
        conversation.id,
        run_id,
        user_message,
        # A tiny model takes the runtime block for the question (measured: Paris is lost from
        # "What is the capital of France?"), so a brief-prompt model is sent none.
        sent=None if profile.brief_prompt else with_runtime(user_message, info),
        provider=engine.choice.provider,
        model=engine.choice.model,
        # A scheduled job's prompt is not the person's words (memory never quotes it).
        meta=composed.meta(
            meta if meta is not None or provenance == "user" else {"injected_event": provenance}
        ),
    )
    # The rows that kept the message on disk while it waited go in the same transaction; the
    # attachments' bytes are written to the store's folder: not on the event loop.
    turn_id, stored = await store.call(
        held.stored_with, store, t.control.held, begin, off_loop=bool(files)
    )
    named = None if conversation.title is not None else _named_by(text, files, options)
    if named is not None:
        await store.call(store.set_title, conversation.id, title_of(named))
    return turn_id, stored.id


def person_parts(engine: TurnDeps, text: str, files: tuple[File, ...]) -> Composed:
    """The parts (and inline files' meta) of the person's message with `files`, as its row
    keeps them: Heron's own keys out of every attached text file before it is stored or sent."""
    if not files:
        return Composed([Text(text)])
    keys = Redactor(engine.redactor.keys, patterns=False)
    return compose(text, without_keys(files, keys.clean), engine.settings.config.attachments)


def _named_by(text: str, files: tuple[File, ...], options: TurnOptions | None) -> str | None:
    """What titles a conversation this message opens: the person's words, never Heron's own
    message (a goal's nudge titles it with the goal's objective instead)."""
    if options is not None and options.title:
        return options.title
    if options is not None and (options.message_meta or {}).get("synthetic"):
        return None
    return text if text.strip() else ", ".join(f.name or "file" for f in files)


def searched(provenance: str) -> bool:
    """Whether auto-recall searches the history for a turn's message: only for one the person
    sent. Auto-recall puts before the model what the person said before about what they say
    now; the message of a turn Heron opened (a reminder's or a monitor's prompt, the
    heartbeat's list, a goal's nudge, a subagent's result) is Heron's own text, whose search
    finds Heron's earlier such messages, not the person's words (a reminder's prompt pulled the
    fires of other reminders). Its model still has `recall_history` to look up what it needs,
    and the runtime notes (memory, a goal's objective) as any turn. A model without
    recall_history gets no auto-recall either (`offers_recall`)."""
    return provenance == "user"


def offers_recall(t: Turn) -> bool:
    """Whether the turn's model has recall_history. Auto-recall's hits are stored as a call of
    it and its result; a model without the tool (the offline one has none) reads the pair as
    an example and answers with a tool call written out as text, which the person then sees."""
    registry, _, _ = bounds(t.engine, t.control.options)
    return registry.get("recall_history") is not None


async def recall_and_note(t: Turn, text: str, search: bool = True) -> str | None:
    engine, store = t.engine, t.engine.store
    # False: no strong hit, so `recall_rows` searches nothing; the notes are still read.
    strong = await recall_check(engine, text, t.conversation.id) if search else False
    # Inline while the history is small (a thread hop costs more than the search then);
    # nothing left to search when the reader found no strong hit.
    searching = strong is not False
    slow = searching and await store.call(memory_wiring.search_is_slow, store)
    return await store.call(notes_before, engine, t.conversation, text, strong, off_loop=slow)


def notes_before(
    engine: TurnDeps, conversation: Conversation, text: str, strong: bool | None
) -> str | None:
    """In one hop to the store's thread: recall and the memory note, and the line of a
    sustained goal (heron/proactive/goals.py, `runtime_notes`) for the runtime block."""
    note = before_message(engine, conversation.id, text, strong)
    notes = engine.attached.runtime_notes
    extra = notes(conversation.key) if notes is not None else None
    return "\n".join(n for n in (note, extra) if n) or None


async def recall_check(engine: TurnDeps, text: str, conversation_id: int) -> bool | None:
    """Auto-recall's search on its own connection and thread while other turns run (it is
    mostly SQLite time, which then overlaps the loop's work); None: search inline."""
    from heron.memory.recall import wants_recall

    reader = engine.recall_reader
    if reader is None or engine.recall is None or engine.turns_running < 2:
        return None
    if not wants_recall(text):
        return False
    store = engine.store
    slow = store.is_long(conversation_id)  # what the model sees is read from the branch
    own = await store.call(memory_wiring.own_to_show, store, conversation_id, off_loop=slow)
    return await reader.strong(text, conversation_id, own)


def before_message(
    engine: TurnDeps, conversation_id: int, text: str, strong: bool | None = None
) -> str | None:
    """Before the user's message is committed: auto-recall (stored as rows just before it, so
    later requests replay them) and the runtime block's memory note. `strong`: whether the
    search found a hit strong enough, when already asked (`recall_check`)."""
    share = engine.settings.config.context.recall
    chars = memory_wiring.auto_recall_chars(window_for(engine), share)
    memory_wiring.recall_rows(
        engine.store, engine.recall, conversation_id, text, strong, max_chars=chars
    )
    return memory_wiring.memory_note(engine.memory, conversation_id)


# ---- RUN --------------------------------------------------------------------------------------


async def run(t: Turn, given: BuiltTurn | RunAgain) -> PendingSave | RunAgain:
    """The runner on the built context. A final-looking reply is held for SAVE; a context
    overflow shrinks the window, compacts, builds the context again and runs once more."""
    window: int | None = None
    earlier: TurnFigures | None = None
    if isinstance(given, RunAgain):
        built, window, retries = given.built, given.window, given.retries
        earlier = given.earlier
    else:
        built, retries = given, 0
    t.built = built
    if isinstance(given, RunAgain):  # the overflowed run closed the mailbox; reopen it
        t.control.mailbox.open = t.control.mailable
    try:
        pending = await run_once(t, built)
    finally:
        t.control.mailbox.open = False
    pending = dataclasses.replace(pending, figures=pending.figures.after(earlier))
    t.run = pending.run
    error = pending.run.error
    if isinstance(error, ContextOverflow) and retries < MAX_OVERFLOW_RETRIES:
        store = t.engine.store
        await store.call(pending.write, True)  # the failed run's rows before the retry's own
        overflowed = window_for(t.engine, window)
        window = window_after(t.engine, overflowed, error.limit)
        notice = functools.partial(
            stated_notice, t.engine.choice.model, overflowed, window, error.limit
        )
        rebuilt = await rebuild_after_overflow(t, built, window, notice)
        return RunAgain(rebuilt, window, retries + 1, pending.figures)
    t.pending = pending
    return pending


async def run_once(t: Turn, built: BuiltTurn) -> PendingSave:
    engine, store = t.engine, t.engine.store
    ctx = tool_context(t, built)
    t.stopped_output = ctx.partials
    trace = trace_for(engine, built, t.conversation.agent)
    recorder = TurnRecorder(store, t.conversation.id, built.turn_id, trace, t.hooks.on_tool_end)
    await built.compaction_calls.attach(recorder.model_call)  # in the trace, in the usage
    for notice in built.notices:
        trace.notice(notice)  # what the person was told, in the trace too
        if t.hooks.on_notice is not None:
            t.hooks.on_notice(notice)
    final: list[Message] = []
    profile = engine.choice.profile
    registry, limits, retry = bounds(engine, t.control.options)
    runner = Runner(engine.provider, registry, profile, limits, retry, engine.redactor)
    system = built.system
    try:
        run = await runner.run(system, built.messages, ctx, run_hooks(t, recorder, final))
    except StaleTurn:  # /stop or /new overtook it: SAVE finds it stale and keeps nothing more
        await recorder.flush_trace()
        figures = recorder.figures("interrupted", "stale", None, "")
        return PendingSave(RunResult([], "interrupted"), (), figures, recorder)
    except asyncio.CancelledError:  # a hard break: the trace says where, the turn row its figures
        prints = engine.memos.prompts.fingerprint(system)
        await asyncio.shield(recorder.interrupted(prints))
        raise
    except Exception:
        if final and await t.control.token.current(store):
            await recorder.commit(final)  # the run failed after its final reply: keep it
        await recorder.flush_trace()  # rows held for a reply that never got stored
        raise
    finally:
        built.compaction_calls.detach()
        await ctx.aclose()
    if run.note is not None and t.hooks.on_notice is not None:  # a reply the cap cut
        t.hooks.on_notice(run.note)
    status = "failed" if run.stop == "error" else "done"
    error = str(run.error) if run.error else None
    prints = engine.memos.prompts.fingerprint(system)
    figures = recorder.figures(status, run.stop, error, prints)
    return PendingSave(run, tuple(final), figures, recorder)


def result_budget(t: Turn, built: BuiltTurn) -> int:
    """The characters of one result the tools return: the view's budget for it when that is
    smaller (a small window's), so a tool cuts its output once, to what the model reads, and
    keeps its own last lines (an exit code, a paging footer) within it."""
    configured = t.engine.settings.config.agent.result_budget
    governor = built.governor
    return configured if governor is None else min(configured, governor.deps.budget.result_chars)


def tool_context(t: Turn, built: BuiltTurn) -> ToolContext:
    engine, conversation = t.engine, t.conversation
    # The conversation's kernel, kept by the process between its turns (given back at the
    # run's end by `ctx.aclose()`); a new one asks, at its first cell, whether the model saw
    # cells of an earlier process's kernel.
    key, store = KernelKey.of(conversation), engine.store
    earlier = functools.partial(
        store.call, store.used_tool, conversation.id, "run_cell", off_loop=True
    )
    kernel = engine.kernels.take(key, earlier, whose=f"conversation {conversation.key}")
    return ToolContext(
        kernel=kernel,
        keep_kernel=functools.partial(engine.kernels.release, key),
        workspace=engine.settings.paths.workspace,
        result_budget=result_budget(t, built),
        redactor=engine.redactor,
        sandbox=engine.sandbox,
        approve=t.hooks.approve or engine.approve,  # the channel's, else the engine's default
        # work_state, todos and scratchpad keep their data per conversation and agent;
        # `message` delivers through the turn's control.
        services=TurnServices(
            store=engine.store,
            conversation_id=conversation.id,
            conversation_key=conversation.key,
            turn_start=built.user_message_id,
            view_cuts=built.governor.not_whole if built.governor is not None else None,
            agent=conversation.agent,
            turn=t.control,
            memory=engine.memory,
            recall=engine.recall,
            timezone=engine.settings.config.agent.timezone,
            home=engine.settings.paths.home,
            jobs_changed=engine.attached.jobs_changed,
            subagents=engine.attached.subagents,
            asks=engine.attached.asks,
        ),
    )


def bounds(
    engine: TurnDeps, options: TurnOptions | None
) -> tuple[ToolRegistry, RunLimits, RetryPolicy]:
    """The tools, ceilings and request deadline of a run: the engine's, narrowed by the
    TurnOptions of a turn Heron started (a subagent's own ceilings and tools; a goal's turn
    has no wall-clock model deadline, long autonomous work is expected)."""
    registry, limits, retry = engine.registry, engine.limits, engine.retry
    if options is None:
        return registry, limits, retry
    if options.max_model_calls is not None:
        limits = dataclasses.replace(limits, max_model_calls=options.max_model_calls)
    if options.max_tokens is not None:
        limits = dataclasses.replace(limits, max_tokens_total=options.max_tokens)
    if options.tools is not None or options.without:
        keep = set(options.tools) if options.tools is not None else set(registry.names())
        keep -= set(options.without)
        chosen = [
            tool for name in registry.names() if name in keep and (tool := registry.get(name))
        ]
        registry = ToolRegistry(chosen, before_call=registry.before_call)
    if options.no_deadline:
        retry = dataclasses.replace(retry, deadline=NO_DEADLINE)
    return registry, limits, retry


def run_hooks(t: Turn, recorder: TurnRecorder, final: list[Message]) -> RunHooks:
    """The run's hooks, composed here once. What each does, in the order it does it:

    on_message     the epoch token's check (a stale turn stops: StaleTurn), then the record.
                   A final-looking reply (assistant, no tool calls) is not committed but held
                   in `final` for SAVE, whose check covers it; anything the run adds after it
                   (mail, a continuation) commits it first, in order. An assistant message with
                   calls opens the tool phase's checkpoint.
    on_model_call  refused once stale (but for a call stopped mid-stream: it was billed); the
                   governor calibrates its estimate from the usage, then the recorder counts
                   the call and holds its trace row for the next write
    on_tool_call   the token's check, the recorder (trace row; the channel's tool_end), then
                   the checkpoint (written under the token's check too); a call that ends
                   after a stop is recorded as a stopped one, as the conversation closes it
    on_tool_stopped  a call the stop cut: the recorder's trace row, marked interrupted
    on_event, on_progress   the channel's, silent once the turn is stale
    drain          the mailbox; every delivery recorded in the trace
    should_break   the mailbox's break request; a break taken recorded in the trace
    govern         the governor's view of the record before every call (compaction in flight,
                   told to the channel as a notice: the terminal showed no trace of it)
    """
    control, store, governor = t.control, t.engine.store, t.built and t.built.governor
    token, checkpoint = control.token, control.checkpoint
    observed = governor.observing(recorder.model_call) if governor else recorder.model_call

    async def on_message(m: Message) -> None:
        if m.role == "assistant" and not m.tool_calls:
            final.append(m)  # held: what streamed of it stays in t.partial until committed
            return
        t.partial = ""  # streamed text up to here is in the messages committed now
        await token.check(store)
        batch = [*final, m]
        final.clear()
        await recorder.commit(batch)
        control.mailbox.stored(held_rows(batch))  # mail stored: owed to no next turn
        if m.role == "assistant":
            checkpoint.open_phase([c.id for c in m.tool_calls])

    async def on_model_call(record: ModelCallRecord) -> None:
        if token.stale and record.streamed is None:  # a stopped call is kept: it was billed
            raise StaleTurn
        await observed(record)

    async def on_tool_call(record: ToolCallRecord) -> None:
        try:
            await token.check(store)
        except StaleTurn:  # stopped as it ended: its result is the interrupted one, there too
            partials, started = t.stopped_output, record.started
            await recorder.tool_stopped(stopped_record(record.call, partials, started))
            raise
        await recorder.tool_call(record)
        await checkpoint.add(record.result, token, store)

    trace, mailbox = recorder.trace, control.mailbox
    writes = t.engine.memos.tool_writes
    return RunHooks(
        on_event=_kept(t, _muted(t.hooks.on_event, control)),
        on_progress=_muted(t.hooks.on_progress, control),
        on_message=on_message,
        on_model_call=on_model_call,
        on_tool_call=on_tool_call,
        on_tool_stopped=recorder.tool_stopped,
        on_tool_start=t.hooks.on_tool_start,
        drain=trace.drain(mailbox.drain) if trace else mailbox.drain,
        govern=_told(t, governor, _muted(t.hooks.on_notice, control), trace) if governor else None,
        on_retry=t.hooks.on_retry,
        should_break=trace.breaks(mailbox.should_break) if trace else mailbox.should_break,
        outside_calls=(lambda: governor.model_calls) if governor else None,
        watch_tools=writes.watching if writes else None,
    )


def _kept(t: Turn, fn: Callable[[Any], None] | None) -> Callable[[Any], None] | None:
    """The channel's stream, with the text it was shown kept in `t.partial`: a turn stopped
    mid-reply records what the person already read (`interrupted`)."""
    if fn is None:
        return None

    def call(event: StreamEvent) -> None:
        if event.kind == "text":
            t.partial += event.text
        elif event.kind == "retry":  # the call starts again: the reply follows anew
            t.partial = ""
        fn(event)

    return call


def _told(
    t: Turn,
    governor: Governor,
    notice: Callable[[Any], None] | None,
    trace: TraceRecorder | None,
) -> Callable[[list[Message]], Awaitable[list[Message]]]:
    """The governor's view, with a notice for each in-flight compaction it makes; once the
    turn is tight (the window too small for its work), one notice says so and the folds
    that follow are not told one by one. The tight notice is said once per conversation and
    window in a process (it was repeated at every tool turn of a small window); the trace of
    every turn that became tight keeps it."""
    told = t.engine.memos.told_tight

    def say(text: str, shown: bool = True) -> None:
        if trace is not None:
            trace.notice(text, shown)
        if notice is not None and shown:
            notice(text)

    async def govern(view: list[Message]) -> list[Message]:
        before, tight = governor.inflight, governor.tight
        shaped = await governor.govern(view)
        if tight:
            return shaped
        if governor.tight:
            key = (t.conversation.id, governor.deps.budget.window)
            say(governor.tight_notice(), key not in told)
            told.add(key)
        elif governor.inflight > before:
            say(INFLIGHT_NOTICE.format(n=governor.inflight))
        return shaped

    return govern


# What a channel shows when a long turn is compacted in flight (heron/compaction/governor.py).
INFLIGHT_NOTICE = (
    "Compacted this turn's earlier steps into checkpoint {n} to fit the model's window."
)


def _muted(fn: Callable[[Any], None] | None, control: TurnControl) -> Callable[[Any], None] | None:
    if fn is None:
        return None

    def call(arg: Any) -> None:
        if not control.stale:
            fn(arg)

    return call


def window_after(engine: TurnDeps, overflowed: int, stated: int | None) -> int:
    """The window of the run after an overflow: the one the server stated when it is smaller
    than the one that `overflowed`, kept for every later turn of the process (the server will
    not grow it); else a quarter smaller."""
    if stated is not None and stated < overflowed:
        learn_window(engine, stated)
        return stated
    return int(overflowed * OVERFLOW_SHRINK)


def learn_window(engine: TurnDeps, stated: int) -> None:
    """The server's window becomes the process's: no window past it (window_for), and a
    profile whose window and output cap fit it, so a request's `max_tokens` leaves room for
    its prompt (vLLM refuses a request whose prompt and `max_tokens` together pass it)."""
    engine.stated_window = stated
    profile = engine.choice.profile
    fitted = dataclasses.replace(
        profile,
        context_window=min(profile.context_window, stated),
        max_output=output_for(profile.max_output, stated),
    )
    engine.choice = dataclasses.replace(engine.choice, profile=fitted)
    engine.memos.trace = None  # a trace records the profile its requests went with


def stated_notice(
    model: str, overflowed: int, window: int, stated: int | None, compacted: CompactionReport
) -> list[str]:
    """What the person is told once a server stated a window smaller than Heron's: what
    compacting for it did (`compacted`: it may have folded nothing, its summary failing),
    and the setting that spares the next process the refused request."""
    if stated is None or window != stated:
        return []
    if compacted.changed:
        done = "the conversation was compacted to fit it"
    elif compacted.kind == "failed":
        done = f"the turn runs again built for it; nothing was compacted ({compacted.error})"
    else:
        done = f"the turn runs again built for it; nothing was compacted ({compacted.why})"
    return [
        f"The model server's window is {stated:,} tokens, not the {overflowed:,} Heron "
        f"assumed: {done}. Set {window_setting(model)} to {stated} so every run starts there."
    ]


async def rebuild_after_overflow(
    t: Turn, built: BuiltTurn, window: int, notices: Callable[[CompactionReport], list[str]]
) -> BuiltTurn:
    """Compact for the smaller `window` (the summary's own request goes to the same server),
    and build the turn's context again as BUILD does: the system prompt (with the new
    summary), the view and the governor, all for that window. Compaction's calls go in the
    turn's trace and usage; `notices` of what the compaction did are told as the run starts
    again."""
    anchor = built.governor.anchor_id if built.governor else None
    assert anchor is not None, "an overflow is retried only with the view BUILD derived"
    calls = built.compaction_calls
    compacted = await compact_conversation(
        t.engine, t.conversation, reason="overflow", window=window, on_call=calls
    )
    prepared = await prepare_turn(
        t.engine, t.conversation, t.agent, built.turn_id, anchor, window=window, on_call=calls
    )
    return dataclasses.replace(
        built,
        system=prepared.system,
        messages=prepared.messages,
        governor=prepared.governor,
        notices=notices(compacted),  # BUILD's were told as the first run started
    )


# ---- SAVE -------------------------------------------------------------------------------------


async def save(t: Turn, pending: PendingSave) -> Saved:
    """The commit-time check (epoch unchanged, the lease still ours) and the run's last writes
    in one transaction; then the outcome."""
    t.pending = None
    if not await settle(t, pending):
        await stopped_at_save(t, pending)
        return Saved(None, Outcome.STALE)
    run = pending.run
    if run.error is not None:
        options = t.control.options
        job = (options.message_meta or {}).get("job") if options is not None else None
        if job is not None:  # the scheduler reports it, once per failing streak (`_failed`)
            return Saved(None, Outcome.DELIVERED)
        return Saved(failed_note(str(run.error), t.control.provenance), Outcome.DELIVERED)
    if t.control.spoke:
        return Saved(None, Outcome.SPOKE_VIA_TOOL)
    if not run.text.strip():
        return Saved(None, Outcome.SILENT)
    return Saved(run.text, Outcome.DELIVERED)


async def settle(t: Turn, pending: PendingSave) -> bool:
    """`es.settle_turn`: the check, the pending writes (told whether the turn is current: a
    stale turn keeps only its trace rows), and when current, the checkpoint dropped and the
    lease given back."""
    store, token = t.engine.store, t.control.token
    if token.stale or token.conversation_id is None or token.owner is None:
        ok = await token.current(store)
        await store.call(pending.write, ok)
        return ok
    try:
        ok = await store.call(
            es.settle_turn,
            store,
            token.conversation_id,
            token.epoch,
            token.owner,
            clear_checkpoint=t.control.checkpoint.written,
            finish=pending.write,
        )
    except Exception:
        with contextlib.suppress(Exception):  # rolled back: the trace rows of the calls made
            await store.call(pending.write, False)
        raise
    token.stale = not ok
    if ok and t.lease is not None:
        t.lease.released = True
    return ok


async def stopped_at_save(t: Turn, pending: PendingSave) -> None:
    """SAVE found the turn stale: a /stop or /new from another process landed after the
    turn's last look at the epoch (`stops_elsewhere`). Closed as a stopped turn is (what
    streamed kept as its interrupted answer, `interrupted`), with its figures; and what
    stopped it read from the store for its channel."""
    store, control = t.engine.store, t.control
    if control.stopped_by is None:
        _, by = await store.call(es.epoch_and_note, store, t.conversation.id)
        control.stopped_by = by or ELSEWHERE
    if t.built is None:
        return
    figures = dataclasses.replace(pending.figures, status="interrupted", stop_reason="stale")
    finish = functools.partial(pending.recorder.finish_turn, figures)
    conversation_id, turn_id = t.conversation.id, t.built.turn_id
    (said, author), owner = stopped_reply(t), control.token.owner
    printed = t.stopped_output
    await store.call(
        es.close_stale_turn, store, conversation_id, turn_id, owner, said, finish, printed, author
    )


# ---- RESPOND ----------------------------------------------------------------------------------


async def respond(t: Turn, given: Saved | Answered) -> Done:
    """What the channel is handed: nothing from a stale turn, and internal work speaks only
    through `message` (its answer and errors stay in the record)."""
    reply, outcome = given.reply, given.outcome
    if outcome is Outcome.STALE or t.control.stale:
        reply, outcome = None, Outcome.STALE
    elif not t.control.visible and t.command is None:
        reply = None
        outcome = Outcome.SPOKE_VIA_TOOL if t.control.spoke else Outcome.SILENT
    if reply is not None and outcome is Outcome.SILENT:
        outcome = Outcome.DELIVERED
    return Done(reply, outcome)


# ---- the table --------------------------------------------------------------------------------

STEPS: dict[State, Step] = {
    State.RESTORE: restore,
    State.COMMAND: command,
    State.BUILD: build,
    State.RUN: run,
    State.SAVE: save,
    State.RESPOND: respond,
}


def _leads_to(step: Step) -> frozenset[State]:
    """The states a step's return annotation names (`A | B` -> {A.next, B.next})."""
    returned = typing.get_type_hints(step)["return"]
    kinds = typing.get_args(returned) or (returned,)
    return frozenset(kind.next for kind in kinds)


TRANSITIONS: dict[State, frozenset[State]] = {
    **{state: _leads_to(step) for state, step in STEPS.items()},
    State.DONE: frozenset(),
}


# ---- leaving ----------------------------------------------------------------------------------


async def interrupted(t: Turn) -> None:
    """A hard break or a failure inside the machine: record the turn as interrupted and leave
    the record whole (finished tool results restored, a minimal stopped reply)."""
    t.control.void()
    pending, t.pending = t.pending, None
    store = t.engine.store
    # A disk that refuses writes (full, read-only) refuses these too: the turn's own error
    # says so, and the next turn on the conversation closes this one (RESTORE, `Lease.dirty`).
    with contextlib.suppress(StoreRefused):
        if pending is not None:  # a run that ended before SAVE: its trace rows, not its reply
            await store.call(pending.write, False)
        if t.built is not None:
            said, author = stopped_reply(t)
            conversation_id, turn_id = t.conversation.id, t.built.turn_id
            printed = t.stopped_output
            await store.call(es.close_turn, store, conversation_id, turn_id, said, printed, author)


def message_unsaved(control: TurnControl, text: str) -> bool:
    """Whether a turn that failed lost the message that opened it: it failed before the message
    was stored (a full or read-only disk, the lease never won), so there is nothing to answer
    again and the person must send it again. A command stores no message of its own (the one
    --retry answers was stored by an earlier turn), nor does a recovered workflow's turn."""
    if control.saved_id is not None or resumed_id(control) is not None:
        return False
    return commands.parse(text) is None


def resumed_id(control: TurnControl) -> int | None:
    options = control.options
    return None if options is None else options.answer_id


def stopped_reply(t: Turn) -> tuple[str, str | None]:
    """The reply a stopped turn is recorded with, and its author: what the person read of it
    (the model's words) then the mark that it was stopped there; the minimal stopped reply,
    Heron's (None: by its meta), when nothing streamed."""
    if t.partial.strip():
        return f"{t.partial.rstrip()}\n\n{REPLY_STOPPED}", "model"
    return STOPPED, None


def result_of(t: Turn, done: Done) -> TurnResult:
    run = t.run or RunResult([Message("assistant", [Text(done.reply or "")])], "done")
    built = t.built
    return TurnResult(
        t.conversation,
        built.run_id if built else "",
        run,
        fingerprint(built.system) if built else "",
        outcome=done.outcome,
        reply=done.reply,
        command=t.command,
        switch_to=t.switch_to,
        states=[s.name for s in t.trail],
        stopped_by=t.control.stopped_by if done.outcome is Outcome.STALE else None,
        model_answered=t.model_answered,
    )


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
        on_saved=None,
    )
