"""What the outside world holds of a running turn, in three parts.

    EpochToken      whether the turn is still its conversation's current one: /stop and /new
                    bump the epoch, another process may take the lease, and every commit of
                    the turn checks the token first (in memory, then in the store)
    Mailbox         follow-ups typed while the turn works, and the soft break request; the run
                    drains it after each tool phase and after a final-looking reply
    ToolCheckpoint  the open tool phase's finished results, written as each one finishes, so a
                    turn stopped mid-phase keeps the work it finished

`TurnControl` puts the three together with who started the turn and the `message` tool's
outlet. The AgentLoop makes one per turn and keeps it while the turn runs; the turn's steps
(heron/agent/turn.py) are the only other code that changes it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field

from heron.bus import InboundMessage, TurnOptions
from heron.messages import File, Message, Part, Text, ToolResult
from heron.store import Store
from heron.store import engine_state as es
from heron.tools.context import Question

# Provenance of a turn; a person typing makes it visible, and so does a reminder the person
# asked for (it speaks in their conversation), an announce turn (a subagent's result, no turn
# running) and a goal's nudge; other scheduled and internal work is silent.
VISIBLE = frozenset({"user", "reminder", "announce", "goal"})
# Scheduled work always opens a turn of its own: it is never mailed into a running turn, and
# what the person types while it runs waits for the next turn, on their own channel.
NEVER_MAILED = frozenset({"reminder", "scheduled"})
MAIL_LABEL = "[sent while you were working] "


def mail_label(channel: str | None) -> str:
    """The label of mail: it names the channel it was typed in when that is not the channel of
    the turn's own message (whose runtime block names that one), as `from web`."""
    return MAIL_LABEL if channel is None else f"{MAIL_LABEL[:-2]}, from {channel}] "


_LABELLED = re.compile(r"\[sent while you were working(?:, from ([^\]\s]+))?\] ")


def unlabelled(text: str) -> str | None:
    """The text of mail without its label (`mail_label`); None when `text` is not mail."""
    found = _LABELLED.match(text)
    return None if found is None else text[found.end() :]


def mail_channel(text: str) -> str | None:
    """The channel mail's label names (`mail_label`: one other than the turn's own); None
    when it names none or `text` is not mail."""
    found = _LABELLED.match(text)
    return None if found is None else found.group(1)


def without_labels(text: str) -> str:
    """`text` with every mail label taken out: what the person typed, for lists they read
    (/tree), where "[sent while you were working, from terminal]" is noise."""
    return _LABELLED.sub("", text)


# The meta key of a stored message that carries mail a worker took from another process: the
# ids of the queued messages it holds (heron/scale/), each then answered here and not again.
MAIL_META = "mail_of"


class StaleTurn(Exception):
    """Raised at a re-entry point of a turn whose epoch token is no longer current."""


@dataclass
class EpochToken:
    """The epoch and lease owner a turn started under; `stale` once either has moved on."""

    conversation_id: int | None = None
    epoch: int = 0
    owner: str | None = None
    stale: bool = False

    async def current(self, store: Store) -> bool:
        """The token check of every commit: in memory first, then the store (another process
        may have bumped the epoch or taken the lease)."""
        if self.stale or self.conversation_id is None:
            return not self.stale
        ok = await store.call(es.still_current, store, self.conversation_id, self.epoch, self.owner)
        self.stale = not ok
        return ok

    async def check(self, store: Store) -> None:
        """`current`, raising StaleTurn when it is not."""
        if not await self.current(store):
            raise StaleTurn


class Mail(Message):
    """A follow-up as the run reads it; `refs` are the ids of the queued messages it holds
    (a worker's mail, heron/scale/), stored in its meta so that no other turn answers them;
    `held` the rows that keep it on disk until it is stored (heron/store/held.py), deleted in
    the transaction that stores it."""

    held: tuple[int, ...]

    def __init__(
        self, parts: Iterable[Part], refs: Iterable[str] = (), held: Iterable[int] = ()
    ) -> None:
        super().__init__("user", parts)
        queued = list(refs)
        object.__setattr__(self, "meta", {MAIL_META: queued} if queued else None)
        object.__setattr__(self, "held", tuple(held))

    @property
    def refs(self) -> list[str]:
        held = (self.meta or {}).get(MAIL_META)
        return [str(r) for r in held] if isinstance(held, list) else []


def with_mail(message: Message, mail: Iterable[Message]) -> Message:
    """`message` as the row that also carries `mail`'s parts (the results of a tool phase with
    what was typed meanwhile), holding the mail's refs and held rows."""
    typed = [m for m in mail if isinstance(m, Mail)]
    refs = [r for m in typed for r in m.refs]
    kept = held_rows(typed)
    if (refs or kept) and message.role == "user":
        return Mail(message.parts, refs, kept)
    return message


def held_rows(messages: Iterable[Message]) -> list[int]:
    """The held rows (heron/store/held.py) of the mail among `messages`: stored with them."""
    return [i for m in messages if isinstance(m, Mail) for i in m.held]


@dataclass(frozen=True)
class Unread:
    """A follow-up the run never read: its text, the channel it was typed in when that is not
    the turn's own (None: the same), and the message it came as (None: posted without one)."""

    text: str
    channel: str | None = None
    sender: InboundMessage | None = None


@dataclass
class Mailbox:
    """Follow-ups for the running turn, and whether it was asked to wrap up."""

    items: list[str] = field(default_factory=list)
    # Per item, the id of the queued message it came from (a worker's mail), None for mail
    # posted in this process: the queued one opens its own turn if the run never reads it.
    refs: list[str | None] = field(default_factory=list)
    # Per item, the channel it was typed in; `channel` is the turn's own (set as it starts).
    channels: list[str | None] = field(default_factory=list)
    channel: str | None = None
    # Per item, the message it came as (None: posted without one): what a follow-up the run
    # never read is kept as, with the channel and chat that sent it (`take`).
    senders: list[InboundMessage | None] = field(default_factory=list)
    # Messages Heron injects into the run (a subagent's result), drained before the mail and
    # stored with their own meta and author.
    events: list[Message] = field(default_factory=list)
    # Held mail drained but not yet stored (`stored`): a stop between the drain and the run's
    # commit leaves it unread, so it opens the next turn as undrained mail does (`take`).
    unstored: list[Unread] = field(default_factory=list)
    open: bool = True  # False once the run passed its last drain: new mail waits for next turn
    break_requested: float | None = None
    break_seen: bool = False

    def post(
        self,
        text: str,
        ref: str | None = None,
        channel: str | None = None,
        sender: InboundMessage | None = None,
    ) -> bool:
        if not self.open:
            return False
        self.items.append(text)
        self.refs.append(ref)
        self.channels.append(None if channel == self.channel else channel)
        self.senders.append(sender)
        return True

    def unread_senders(self) -> list[InboundMessage]:
        """The messages whose mail of this process the run has not read (yet): those that
        open the next turn if it ends now (`take`)."""
        posted = [s for s, ref in zip(self.senders, self.refs, strict=True) if not ref]
        senders = [u.sender for u in self.unstored] + posted
        return [s for s in senders if s is not None]

    def take(self) -> list[Unread]:
        """The mail of this process the run has not read, in the order it came, and the
        mailbox emptied (mail from a queue is left to its own turn there)."""
        rows = zip(self.items, self.refs, self.channels, self.senders, strict=True)
        mail = [Unread(text, channel, sender) for text, ref, channel, sender in rows if not ref]
        mail, self.unstored = self.unstored + mail, []
        self.items, self.refs, self.channels, self.senders = [], [], [], []
        return mail

    def inject(self, message: Message) -> bool:
        if not self.open:
            return False
        self.events.append(message)
        return True

    async def drain(self) -> list[Message]:
        mail, refs, self.items, self.refs = self.items, self.refs, [], []
        channels, senders, self.channels, self.senders = self.channels, self.senders, [], []
        events, self.events = self.events, []
        rows = list(zip(mail, refs, channels, senders, strict=True))
        self.unstored += [Unread(t, c, s) for t, _, c, s in rows if s is not None and s.held]
        return events + [
            Mail([Text(mail_label(channel) + text)], [ref] if ref else [], _held_by(sender))
            for text, ref, channel, sender in rows
        ]

    def stored(self, held: Collection[int]) -> None:
        """The run stored the mail whose held rows are `held`: no longer owed to a next turn."""
        self.unstored = [u for u in self.unstored if not set(_held_by(u.sender)) <= set(held)]

    def request_break(self) -> None:
        if self.break_requested is None:
            self.break_requested = time.monotonic()

    def should_break(self) -> bool:
        if self.break_requested is None:
            return False
        self.break_seen = True
        return True


def _held_by(sender: InboundMessage | None) -> tuple[int, ...]:
    return () if sender is None else sender.held


@dataclass
class ToolCheckpoint:
    """The open tool phase of a turn: its calls and the results finished so far."""

    turn_id: int | None = None
    calls: list[str] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    written: bool = False  # SAVE drops the row only when one was written

    def open_phase(self, call_ids: list[str]) -> None:
        self.calls, self.results = call_ids, []

    async def add(self, result: ToolResult, token: EpochToken, store: Store) -> None:
        """Keep one finished result, in the store under the token's check."""
        self.results.append(result)
        if token.conversation_id is None or self.turn_id is None:
            return
        conversation_id, epoch = token.conversation_id, token.epoch
        cp = es.Checkpoint(conversation_id, self.turn_id, epoch, self.calls, self.results)
        if not await store.call(es.write_checkpoint, store, cp, token.owner):
            token.stale = True
            raise StaleTurn
        self.written = True


@dataclass
class TurnControl:
    """A running turn as the AgentLoop and the commands see it."""

    key: str
    provenance: str = "user"
    # The `message` tool's outlet: what it answers its model (None: "Delivered to the user.").
    deliver: Callable[[str], Awaitable[str | None]] | None = None
    ask: Callable[[str], Awaitable[object]] | None = None  # `ask_user`'s: sent as a question
    spoke: list[str] = field(default_factory=list)  # what the `message` tool delivered
    token: EpochToken = field(default_factory=EpochToken)
    mailbox: Mailbox = field(default_factory=Mailbox)
    checkpoint: ToolCheckpoint = field(default_factory=ToolCheckpoint)
    # How a turn Heron started differs (ceilings, tools, meta of its message); None: ordinary.
    options: TurnOptions | None = None
    # The question the run waits on (heron/proactive/ask.py): the next message answers it.
    question: Question | None = None
    # The person's attachments to the message that opens the turn (heron/attachments.py).
    files: tuple[File, ...] = ()
    # The rows keeping that message on disk while it waited (heron/store/held.py), deleted in
    # the transaction that stores it.
    held: tuple[int, ...] = ()
    # What stopped the turn, when a /stop or /new did (`heron.bus.stopped_by`'s words).
    stopped_by: str | None = None
    # The stored row of the message the turn answers, once it is in the store; a turn that
    # failed before (a full disk) lost the message, and must not offer --retry.
    saved_id: int | None = None
    # The run's id once the turn started one (BUILD): a turn cancelled by a /stop, /new or a
    # signal ends with it, so its channel can name the run it recorded (`heron run --json`).
    run_id: str = ""
    # Set once that message is stored, or once it will not be soon (the lease is busy in
    # another process): a /stop waits for it, so a stop right behind its message keeps it.
    settled: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.mailbox.open = self.mailable

    @property
    def visible(self) -> bool:
        return self.provenance in VISIBLE

    @property
    def mailable(self) -> bool:
        """Whether the run reads mail at all (scheduled work never does)."""
        return self.provenance not in NEVER_MAILED

    @property
    def accepting_mail(self) -> bool:
        """Whether mail still reaches the run (False once it passed its last drain)."""
        return self.mailbox.open and not self.token.stale

    @accepting_mail.setter
    def accepting_mail(self, value: bool) -> None:
        self.mailbox.open = value

    @property
    def stale(self) -> bool:
        return self.token.stale

    def void(self, by: str | None = None) -> None:
        """/stop, /new or a failure: nothing more of this turn is kept or shown; `by` says
        what stopped it, for its channel."""
        self.token.stale = True
        self.mailbox.open = False
        if by is not None and self.stopped_by is None:
            self.stopped_by = by

    def post(
        self,
        text: str,
        ref: str | None = None,
        channel: str | None = None,
        sender: InboundMessage | None = None,
    ) -> bool:
        """A follow-up for the running turn (`ref`: the id of the queued message it is, for a
        worker's mail; `channel`: where it was typed; `sender`: the message it came as);
        False once the run passed its last drain or the turn was stopped (the message then
        waits for the next turn)."""
        return not self.token.stale and self.mailbox.post(text, ref, channel, sender)

    def inject(self, message: Message) -> bool:
        """Put a message of Heron's (a subagent's result) in the mailbox; False once the run
        has passed its last drain or was stopped (it then opens a turn of its own)."""
        return not self.token.stale and self.mailbox.inject(message)
