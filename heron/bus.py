"""The bus between channels and the engine.

Channels publish `InboundMessage`s; the `AgentLoop` consumes them and publishes
`OutboundMessage`s (answers, command replies, notices) and, for a channel that asks for them
(`InboundMessage.events`), the `TurnEvent`s of the turns it starts: start and end, streamed text
and reasoning, tool calls, retries. Both travel on one queue, so a channel sees them in the
order they happened. The `Dispatcher` hands each one to the channels registered for it: the one
place where replies are delivered implicitly; nothing else in Heron writes to a channel on a
turn's behalf, and the engine knows no screen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from heron.messages import File, ToolCall, ToolResult, Usage

# What a channel shows where a retried stream differs from what it already showed.
RETRY_MARKER = "[the stream was cut; the reply starts again]"
# What a run streams where its reply goes on after reading mail (heron/agent/runner.py): the
# answer to the mail starts a paragraph of its own, and a `heron run` whose message joined the
# turn as mail prints from there (heron/channels/script.py).
MAIL_BREAK = "\n\n"
# /retry's answer where there is no message to answer again (`heron run --json`: not ok).
NOTHING_TO_RETRY = "Nothing to retry yet."
# Its answer when every message of yours on the branch came before the last /new: retrying one
# would send the model the conversation /new dropped (`heron run --json`: not ok, as above).
NOTHING_SINCE_NEW = (
    "Nothing to retry since /new: the model starts fresh there, and your earlier messages stay "
    "in the transcript above it. Send the message again to ask it in the new conversation."
)
# `heron run --retry` sends /retry with this word: it answers only a message left without its
# answer (a failed turn), never one already answered again, which would redo that turn's tools.
RETRY_UNANSWERED = "unanswered"
# Its answer when the last message has its answer (`heron run --json`: not ok, as above).
ALREADY_ANSWERED = (
    "Nothing to retry: your last message in this conversation already has its answer. "
    "`/retry` in heron chat answers it again on a new branch."
)
# Who started a turn: the person; a scheduled job, silent ("scheduled": a monitor, the
# heartbeat) or speaking in the conversation it was made in ("reminder"); a subagent
# ("subagent", silent; "announce": its result opening a visible turn of its own); a goal's
# nudge turn ("goal", visible: it is the person's goal); Heron ("internal").
Provenance = Literal["user", "reminder", "scheduled", "subagent", "internal", "announce", "goal"]
# "question": what `ask_user` asks; the conversation's next message answers it.
OutKind = Literal["answer", "message", "question", "command", "error", "notice"]
EventKind = Literal[
    "turn_start",  # a turn began for the message (or for mail queued behind one)
    "saved",  # the message that opened the turn is in the store: `message_id` names its row
    "delta",  # streamed answer text
    "reasoning",  # streamed reasoning
    "progress",  # interim text the model wrote before a tool call
    "tool_start",
    "tool_end",
    "retry",  # the provider call failed and is tried again in `seconds`
    "restart",  # a retried stream differs from what was shown: the reply starts again
    "busy",  # another process holds the conversation; the turn waits for it
    "mail",  # the message went to the running turn's mailbox and is answered in it
    "queued",  # the message waits for the running turn and opens the next one
    # The message went to the running turn as mail, but that turn ended (failed, stopped)
    # without reading it: it opens the next turn, whose events answer it.
    "carried",
    "approval",  # a command waits for the person's yes or no (`approval` says which)
    "approval_end",  # that wait is over: answered, stopped, or past its deadline
    "turn_end",
    # A turn another process ran and ended (heron/serve/elsewhere.py): `text` its message,
    # `channel` the program that ran it, `end.reply` what it stored as the reply.
    "elsewhere",
]


@dataclass(frozen=True)
class TurnOptions:
    """How a turn started by Heron itself differs from an ordinary one (heron/proactive): its
    own ceilings, a subset of the tools, no wall-clock model deadline, and the meta its
    message is stored with (which also makes Heron its author)."""

    max_model_calls: int | None = None
    max_tokens: int | None = None
    tools: tuple[str, ...] | None = None  # None: every tool of the engine
    without: tuple[str, ...] = ()  # tools never offered (a subagent cannot spawn)
    no_deadline: bool = False
    message_meta: dict[str, object] | None = None
    bare: bool = False  # no auto-recall into it: a subagent sees only its task
    # A conversation of repeated background checks (a monitor, the heartbeat): once it holds
    # this many turns since its last separator, the turn writes one before its message (at
    # BUILD, under its own lease) and carries the last check's closing note into it, so its
    # model sees a short tail, never every earlier check (heron/agent/turn.py `fresh_start`).
    fresh_after: int | None = None
    # What a conversation this turn opens is titled with: the person's words the turn carries
    # on (a goal's objective). A message of Heron's (meta "synthetic") never titles one.
    title: str | None = None
    # A turn run as a durable workflow (heron/scale/): its run id, derived from the message's
    # id so a recovered attempt finds the one before it; and, for a recovered attempt, the
    # stored message it answers where the record stands (not stored again).
    run_id: str | None = None
    answer_id: int | None = None


@dataclass(frozen=True)
class InboundMessage:
    channel: str  # "terminal", "web", "schedule", "subagent", ...
    chat_id: str  # which chat on that channel
    text: str
    key: str | None = None  # the conversation key; None: derived from channel and chat
    provenance: Provenance = "user"
    agent: str = "default"
    meta: dict[str, str] = field(default_factory=dict)
    events: bool = False  # the channel wants this message's TurnEvents (streams, tools, end)
    options: TurnOptions | None = None
    files: tuple[File, ...] = ()  # attachments (heron/attachments.py), checked by the channel
    # Its id as a durable workflow (heron/scale/: enqueued once under it); None in one process.
    id: str | None = None
    # The rows keeping it on disk while it waits for a busy conversation's turn
    # (heron/store/held.py), written by the AgentLoop before its sender is told it was taken.
    held: tuple[int, ...] = ()


@dataclass(frozen=True)
class OutboundMessage:
    channel: str
    chat_id: str
    key: str  # the conversation it belongs to
    text: str
    kind: OutKind = "answer"
    # What a client acts on beyond showing it: "no_worker" (a notice) says no worker will take
    # the message soon (heron/scale/front.py), so a client waiting for its turn stops;
    # "stop_answer" (/stop's answer) is for the client that sent it: the others hear who stopped
    # the turn from its end (`TurnEnd.stopped_by`).
    code: str | None = None
    # Who said it, when not the conversation's own turn: background work's label ("the
    # heartbeat check", "scheduled job 3 (a monitor)"), shown with the text by the clients.
    by: str | None = None
    # /resume's answer: the conversation its client goes on in. That client alone moves; the
    # serve tells the conversation's other clients that one left (heron/serve/hub.py).
    switch_to: str | None = None
    # The stored row the notice speaks of (an `unanswered` one: the row that keeps the
    # message), so that a client shows the notice after it, not above it.
    message_id: int | None = None


STOP_ANSWER_CODE = "stop_answer"
# A notice to the client that sent a message no turn of this process will answer (it is
# shutting down): the text says what became of it (kept in its conversation, or not run), and
# a client waiting for that message's turn stops waiting (heron/agent/loop.py `close`).
UNANSWERED_CODE = "unanswered"
# Said first to that client, before the turn it mailed into ends: its message is being kept
# and the `unanswered` notice follows once it is written (or failed to be), so a client whose
# mail's turn ends meanwhile waits for that notice rather than taking the end for its answer.
KEEPING_CODE = "keeping"


# A channel as the person knows it, where they read who stopped a turn.
CHANNEL_NAMES = {"web": "the browser", "terminal": "heron chat", "script": "heron run"}


def answered_in(chat_id: str | None) -> str:
    """Where a client answered, as its person reads it: `in the browser`, not the serve's id
    for that client (`web-3`: its session's channel and number, heron/serve/session.py)."""
    channel, _, number = (chat_id or "").rpartition("-")
    if channel == "cli" and number.isdigit():  # the control socket: heron chat or heron run
        return "in another terminal"
    where = CHANNEL_NAMES.get(channel) if number.isdigit() else None
    return f"in {where}" if where else "in another client"


def stopped_by(command: str, channel: str | None, pid: int | None = None) -> str:
    """What stopped a turn, as its person reads it: `/new from the browser`, or, sent from
    another process than the turn's, `/stop from heron run (process 4242)`."""
    where = CHANNEL_NAMES.get(channel, channel) if channel else None
    said = f"/{command}" + (f" from {where}" if where else "")
    return said if pid is None else f"{said} (process {pid})"


def started_afresh(stopped: str) -> bool:
    """Whether `stopped_by` names a /new: the model starts afresh after it, so answering the
    stopped message again (--retry) would answer it where the person no longer is."""
    return stopped.startswith("/new")


# Slash commands whose answer calls no model (heron/agent/commands.py; the offline model makes
# no memory pass at /new): `heron run` answers them without loading the offline model or
# printing its banner, a second or more of a /stop's wait on a busy machine.
MODEL_FREE_COMMANDS = frozenset({"stop", "new", "status", "help", "resume", "tree", "memory"})


def needs_model(text: str) -> bool:
    """Whether a message may call the model: anything but a command of MODEL_FREE_COMMANDS."""
    head = text.strip().partition(" ")[0]
    return not (head.startswith("/") and head[1:] in MODEL_FREE_COMMANDS)


@dataclass(frozen=True)
class TurnEnd:
    """How a turn ended, for the channel that started it."""

    ok: bool
    outcome: str  # heron.agent.turn.Outcome's value
    error: str | None = None
    reply: str | None = None  # what RESPOND delivers (None: nothing)
    command: str | None = None  # the slash command that answered it
    switch_to: str | None = None  # /resume: the channel continues in this conversation
    run_id: str = ""
    model_calls: int = 0
    usage: Usage | None = None  # the turn's tokens, all its model calls together
    cost_usd: float | None = None  # None: unknown
    # What stopped it (outcome "stale"), when known: `stopped_by(...)`'s words.
    stopped_by: str | None = None
    # The turn failed for want of a usable model (heron.errors.model_unusable: the key refused,
    # the server down). Set in-process; a serve's turn_end does not carry it.
    unusable: bool = False
    # The turn failed before the message that opened it was stored (a full or read-only
    # disk): it is lost, so the channel says to send it again and offers no --retry.
    unsaved: bool = False
    # Why the run ended (heron.agent.runner.RunStop): "length" is a reply the output cap cut,
    # incomplete; None: no run to say (an end a client rebuilt without it).
    stop: str | None = None
    # A command's model calls outside the turn (/compact, /learn: a maintenance run, not counted
    # in model_calls) all answered: the model works (heron chat's review at exit).
    model_answered: bool = False
    # A call was billed and never counted (cut after it began, no usage sent): `usage` is a
    # floor, and the cost is unknown (`?`), never worked out from it.
    usage_unknown: bool = False


@dataclass(frozen=True)
class ApprovalAsk:
    """A command of the turn that waits for the person's yes or no (unconfined, approval "ask":
    heron/tools/approval.py), as `heron serve` asks every client of the conversation: its id,
    the tool and the exact command; on "approval_end" how it was decided."""

    id: str
    tool: str
    command: str
    deadline: float = 0.0  # epoch seconds: declined if nobody has answered by then
    allowed: bool = False  # approval_end: the command runs
    by: str | None = None  # approval_end: the chat_id of the client that answered (None: none)
    reason: str = ""  # approval_end: "answered", "stopped" (/stop, /new, shutdown), "deadline"
    confined: bool = False  # the command runs in the sandbox (approval "ask" chosen anyway)

    def outcome(self) -> str:
        """How the wait ended, for a client to show (approval_end)."""
        if self.reason == "answered":
            return f"{'allowed' if self.allowed else 'declined'} {answered_in(self.by)}"
        if self.reason == "deadline":
            return "declined: nobody answered in time"
        return "declined: the turn was stopped"


@dataclass(frozen=True)
class TurnEvent:
    """Something that happened in a running turn, for the channel that started it."""

    channel: str
    chat_id: str
    key: str
    kind: EventKind
    text: str = ""  # delta, reasoning, progress and notice text; turn_start: the message
    call: ToolCall | None = None  # tool_start, tool_end
    result: ToolResult | None = None  # tool_end
    seconds: float = 0.0  # tool_end: how long it ran; retry: the wait before the next try
    end: TurnEnd | None = None  # turn_end
    message_id: int | None = None  # saved
    # Who opened the turn: the person, or Heron (a subagent's result, a goal's nudge, a
    # reminder), whose opening message a client shows as Heron's, not as the person's.
    provenance: Provenance = "user"
    approval: ApprovalAsk | None = None  # approval, approval_end
    # turn_start: the message's attachments as "notes.txt (2 kB)", for clients that did not
    # send it (the terminal shows what the browser attached).
    files: tuple[str, ...] = ()


Outbound = OutboundMessage | TurnEvent
Deliver = Callable[[Outbound], Awaitable[None]]


class MessageBus:
    """Two queues: what channels send in, what the engine sends out."""

    def __init__(self) -> None:
        self.inbound: asyncio.Queue[InboundMessage] = asyncio.Queue()
        self.outbound: asyncio.Queue[Outbound] = asyncio.Queue()

    async def publish(self, message: InboundMessage) -> None:
        await self.inbound.put(message)

    async def send(self, message: Outbound) -> None:
        await self.outbound.put(message)

    def emit(self, event: Outbound) -> None:
        """Send from synchronous code (a stream callback); the queue is unbounded."""
        self.outbound.put_nowait(event)


class Dispatcher:
    """Delivers outbound messages: to the channel they name, and to any watcher of "*"."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self._channels: dict[str, list[Deliver]] = {}

    def register(self, channel: str, deliver: Deliver) -> None:
        self._channels.setdefault(channel, []).append(deliver)

    async def deliver(self, message: Outbound) -> int:
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
