"""The hub: per conversation, a numbered journal of protocol events and its attached clients.

Everything the AgentLoop sends out (heron/bus.py: TurnEvents and OutboundMessages) reaches the
hub through the Dispatcher's "*" watcher and becomes one protocol event (docs/web.md,
"## Protocol") with `seq`, increasing by 1 per conversation within this process. The journal
keeps the last JOURNAL_SIZE events in memory, so a client that reconnects with `last_seq` gets
exactly the events it missed; older than that, it is told `gap` and reloads the transcript
from the store, which is the truth.

A seq means something only in the process that numbered it: every hub has an `instance` id,
sent in each welcome, and a client names it with its `last_seq` when it comes back. A client
that comes back to another instance (the serve was restarted; its numbering began again at 0)
is told `gap` too, whatever its number: its old `last_seq` would otherwise hide every event of
the new serve up to that number.

At most `cap` idle conversations (no client attached, no turn running) keep their journal
loaded; past that the least recently used is unloaded, keeping only its seq, so numbering goes
on where it stopped. A client that comes back to it with an older `last_seq` is told `gap` and
rereads the transcript from the store: nothing is lost, the events are only not replayed.

A turn another process runs on the home has no events here: heron/serve/elsewhere.py tells
the hub of it from its lease (`started_elsewhere`, `ended_elsewhere`), which numbers an
`elsewhere` event for its conversation and lists it as running for every tab.

Fan-out never blocks the turn: each client has a bounded queue, and a client whose queue is
full is dropped back to a `welcome{gap: true}` at the newest seq (it re-syncs from the store
and goes on from there) instead of holding up everyone else.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from heron.bus import ApprovalAsk, Outbound, OutboundMessage, TurnEnd, TurnEvent, stopped_by
from heron.messages import Usage

log = logging.getLogger(__name__)
JOURNAL_SIZE = 2000
IDLE_CAP = 100  # idle conversations whose journal stays loaded
CLIENT_QUEUE = 1000
Event = dict[str, Any]
# Turn events that are a change of state rather than content: sent as `status{state}`.
_STATES = {k: k for k in ("retry", "restart", "mail", "queued", "carried", "busy")}


@dataclass(eq=False)
class Client:
    """One attached browser tab or terminal: what it has not been sent yet."""

    channel: str
    chat_id: str
    queue: asyncio.Queue[Event] = field(default_factory=lambda: asyncio.Queue(CLIENT_QUEUE))
    key: str | None = None
    gaps: int = 0  # how often it fell behind (tests, diagnostics)
    # Tool calls whose `tool_start` it was never sent (it attached, or fell behind, while they
    # ran): their `tool_end` carries `args` for it, which that event leaves out otherwise.
    unseen: set[str] = field(default_factory=set)

    def offer(self, event: Event, journal: Journal) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self._resync(journal)

    def _resync(self, journal: Journal) -> None:
        """Too far behind: drop what is queued and tell it to reload from the store."""
        while not self.queue.empty():
            self.queue.get_nowait()
            self.queue.task_done()  # Session.end waits on join()
        self.gaps += 1
        self.unseen |= journal.calls.keys()
        self.queue.put_nowait(journal.welcome(self, gap=True))

    def shown(self, event: Event, journal: Journal) -> Event:
        """`event` as this client is sent it: a `tool_end` whose start it missed names the
        call's arguments (a pill that showed `{}` for them, and `/show N` too); another
        client's /resume moves only that client (`_stays`)."""
        if event.get("switch_to") and event.get("chat_id") != self.chat_id:
            return _stays(event, journal.key)
        call = event.get("call_id")
        if event["type"] != "tool_end" or call not in self.unseen:
            return event
        self.unseen.discard(call)
        return {**event, "args": journal.calls.get(call, {})}


@dataclass
class Journal:
    """One conversation's numbered events and its clients."""

    key: str
    size: int = JOURNAL_SIZE
    seq: int = 0
    events: deque[Event] = field(default_factory=deque)
    clients: set[Client] = field(default_factory=set)
    busy: bool = False
    running: set[str] | None = None  # the hub's conversations where a turn runs (welcome)
    waiting: set[str] | None = None  # the hub's where a question or approval waits (welcome)
    # The hub's turns that other processes run, by conversation (heron/serve/elsewhere.py).
    elsewhere: dict[str, Event] | None = None
    title: str | None = None
    turn_id: str | None = None
    about: dict[str, Any] = field(default_factory=dict)  # more for every welcome (the model)
    # A turn's start, held until its message is in the store (`saved` gives turn_start its
    # message_id), or until anything else of the turn comes first (a command saves nothing).
    held: list[Event] = field(default_factory=list)
    # Approvals that wait for an answer, by id: their `approval` events, sent again to a
    # client that attaches without replaying them (a terminal, one told `gap`).
    approvals: dict[str, Event] = field(default_factory=dict)
    # The question the turn waits on (ask_user), sent again to such a client; until the next
    # message answers it (`mail`) or the turn ends.
    question: Event | None = None
    # The running turn's tool calls that have started and not ended: call_id -> arguments,
    # for the clients that attach while they run (`Client.unseen`).
    calls: dict[str, Any] = field(default_factory=dict)

    def append(self, event: Event) -> Event:
        self.seq += 1
        event["seq"], event["conversation"] = self.seq, self.key
        self.events.append(event)
        if len(self.events) > self.size:
            self.events.popleft()
        if event["type"] == "tool_start":
            self.calls[event["call_id"]] = event.get("args") or {}
        for client in list(self.clients):
            client.offer(client.shown(event, self), self)
        if event["type"] == "tool_end":
            self.calls.pop(event["call_id"], None)
        elif event["type"] == "turn_end":
            self.calls.clear()
            for client in self.clients:
                client.unseen.clear()
        return event

    def welcome(self, client: Client, *, gap: bool = False) -> Event:
        """What `client` is told on attaching (and on falling behind): the newest seq, and
        its own chat_id, which the events of its messages carry."""
        event: Event = {
            "type": "welcome",
            "conversation": self.key,
            "seq": self.seq,
            "busy": self.busy,
            "title": self.title,
            "chat_id": client.chat_id,
            **self.about,
        }
        if self.running is not None:
            event["running"] = sorted(self.running)
        if self.waiting is not None:
            event["waiting"] = sorted(self.waiting)
        if self.elsewhere is not None and self.key in self.elsewhere:
            event["elsewhere"] = self.elsewhere[self.key]  # where this conversation's turn runs
        if gap:
            event["gap"] = True
        return event

    @property
    def idle(self) -> bool:
        return not self.clients and not self.busy

    @property
    def waits(self) -> bool:
        """Whether the person's answer is awaited here: a question or a command's approval."""
        return self.question is not None or bool(self.approvals)

    def since(self, last_seq: int) -> list[Event] | None:
        """The events after last_seq, or None when some of them are no longer kept."""
        if last_seq >= self.seq:
            return []
        oldest = self.events[0]["seq"] if self.events else self.seq + 1
        if last_seq + 1 < oldest:
            return None
        return [e for e in self.events if e["seq"] > last_seq]


class Hub:
    """Every conversation's journal; the Dispatcher's "*" watcher feeds it."""

    def __init__(
        self,
        size: int = JOURNAL_SIZE,
        about: dict[str, Any] | None = None,
        cost: Callable[[Usage], float | None] | None = None,
        cap: int | None = None,
    ) -> None:
        self.size = size
        # This process's numbering: a client's `last_seq` counts in the instance it names.
        self.instance = secrets.token_hex(8)
        self.about = about if about is not None else {}
        self.about["instance"] = self.instance
        self.cost = cost  # a turn's price from its usage (None: unknown)
        self.cap = IDLE_CAP if cap is None else cap
        # Least recently used first; `unloaded` keeps the seq of each journal let go.
        self.journals: OrderedDict[str, Journal] = OrderedDict()
        self.unloaded: dict[str, int] = {}
        self.running: set[str] = set()  # conversations where a turn runs, for every client
        # Conversations where a question or an approval waits for the person, for every client:
        # a tab showing another conversation marks them, since only an answer moves them on.
        self.waiting: set[str] = set()
        self.stopping = False  # the serve shuts down: a turn it stops says so
        # Turns another process runs (`heron run --model`), by conversation: the `elsewhere`
        # event that said so, without its seq (heron/serve/elsewhere.py watches the leases).
        self.elsewhere: dict[str, Event] = {}
        # Asked before this process's own turn goes on in a conversation where another
        # process's turn was running: has it ended? (so its end is told first, in order)
        self.settle: Callable[[str], Awaitable[None]] | None = None
        self.attached = asyncio.Event()  # set while some client is attached (the watcher's cue)
        self._turns = itertools.count(1)

    def journal(self, key: str) -> Journal:
        found = self.journals.get(key)
        if found is None:
            seq = self.unloaded.pop(key, 0)
            found = Journal(
                key,
                self.size,
                seq=seq,
                about=self.about,
                running=self.running,
                waiting=self.waiting,
                elsewhere=self.elsewhere,
            )
            self.journals[key] = found
            self._trim(keep=key)
        else:
            self.journals.move_to_end(key)
        return found

    def _trim(self, keep: str | None = None) -> None:
        """Unload the least recently used idle journals past the cap (never `keep`, the one
        being handed out)."""
        idle = [j for j in self.journals.values() if j.idle and j.key != keep]
        for journal in idle[: max(0, len(idle) - self.cap)]:
            del self.journals[journal.key]
            self.unloaded[journal.key] = journal.seq

    def attended(self, key: str) -> bool:
        """Whether some client has conversation `key` open now (it sees what is said there)."""
        journal = self.journals.get(key)
        return journal is not None and bool(journal.clients)

    def attach(
        self, client: Client, key: str, last_seq: int | None, instance: str | None = None
    ) -> None:
        """Attach `client` to `key` (leaving the conversation it was on) and queue its
        welcome, then what it missed: every event after last_seq still kept; none for None
        (a client that wants only what happens from now on); `gap` when some are gone, or
        when `last_seq` was numbered by another serve (`instance`, or a number this one never
        reached). With nothing replayed, the question and the approvals that wait follow, so
        that this client can answer."""
        self.detach(client)
        journal = self.journal(key)
        client.key = key
        foreign = instance is not None and instance != self.instance
        missed = [] if last_seq is None else journal.since(last_seq)
        if last_seq is not None and (foreign or last_seq > journal.seq):
            missed = None  # another serve's number: it tells nothing of what this one sent
        gap = missed is None or len(missed) >= CLIENT_QUEUE
        client.unseen = set(journal.calls) if last_seq is None or gap else set()
        client.queue.put_nowait(journal.welcome(client, gap=gap))
        for event in () if gap else missed or ():
            client.queue.put_nowait(client.shown(event, journal))
        if last_seq is None or gap:  # nothing replayed: what waits for an answer is sent again,
            waiting = [journal.question] if journal.question is not None else []
            # unnumbered: the client saw none of it
            for event in [*waiting, *journal.approvals.values()]:
                client.queue.put_nowait({k: v for k, v in event.items() if k != "seq"})
        journal.clients.add(client)
        self.attached.set()
        log.info("a %s client joined %s", client.channel, key)

    def detach(self, client: Client) -> None:
        if client.key is not None:
            log.info("a %s client left %s", client.channel, client.key)
        if client.key is not None and client.key in self.journals:
            self.journals[client.key].clients.discard(client)
            self._trim()
        client.key = None
        if not any(j.clients for j in self.journals.values()):
            self.attached.clear()

    def started_elsewhere(self, key: str, about: Event) -> None:
        """Another process runs a turn in `key` (`about`: its pid, program, `where`): every
        client of the conversation is told (`elsewhere`, running), and every tab lists it as
        running. Its stream stays in that process."""
        event = {"type": "elsewhere", "running": True, **about}
        self.elsewhere[key] = {k: v for k, v in event.items() if k != "type"}
        journal = self.journal(key)
        journal.append(event)
        self._running(journal)

    def ended_elsewhere(self, key: str, turns: list[Event]) -> None:
        """That turn ended: its clients are told, with what it stored (`turns`: each one's
        message, reply, status), and the tabs no longer list it as running."""
        about = self.elsewhere.pop(key, None) or {}
        journal = self.journal(key)
        journal.append({**about, "type": "elsewhere", "running": False, "turns": turns})
        self._running(journal)

    def publish(self, key: str, event: Event) -> Event:
        return self.journal(key).append(event)

    async def deliver(self, item: Outbound) -> None:
        """The Dispatcher's watcher: one bus item as protocol events."""
        if item.key in self.elsewhere and self.settle is not None and not _opens(item):
            await self.settle(item.key)  # another process's turn there may have just ended
        journal = self.journal(item.key)
        was = (journal.busy, journal.waits)
        if isinstance(item, OutboundMessage):
            held, journal.held = journal.held, []  # the turn's start goes out first
            for event in held:
                journal.append(event)
            message: Event = {"type": "message", "kind": item.kind, "text": item.text}
            if item.code is not None:
                message["code"] = item.code
            if item.by is not None:  # background work's message: who said it
                message["by"] = item.by
            if item.switch_to is not None:  # /resume's answer: where its client goes on
                message.update(switch_to=item.switch_to, channel=item.channel)
            if item.message_id is not None:  # the row it speaks of: shown after it
                message["message_id"] = item.message_id
            sent = journal.append({**message, "chat_id": item.chat_id})
            if item.kind == "question":
                journal.question = sent
        else:
            for event in self._events(journal, item):
                journal.append(event)
        if (journal.busy, journal.waits) != was:
            self._running(journal)
        if journal.idle:  # a turn ended with nobody attached
            self._trim()

    def _running(self, journal: Journal) -> None:
        """Every browser tab, whatever conversation it shows, hears where turns run now and
        where one waits for the person's answer (it marks them in its list): a `status` of the
        hub, outside any journal, so it has no seq. Terminals list nothing live and are not
        sent it."""
        busy = journal.busy or journal.key in self.elsewhere
        for now, where in ((busy, self.running), (journal.waits, self.waiting)):
            if now:
                where.add(journal.key)
            else:
                where.discard(journal.key)
        status: Event = {"type": "status", "state": "running", "running": sorted(self.running)}
        status["waiting"] = sorted(self.waiting)
        for each in self.journals.values():
            for client in list(each.clients):
                if client.channel == "web":
                    client.offer(dict(status), each)

    def _events(self, journal: Journal, ev: TurnEvent) -> list[Event]:
        if ev.kind in ("mail", "turn_end"):  # the question answered, or its turn over
            journal.question = None
        if ev.kind == "turn_start":
            held, journal.held = journal.held, []  # a start that never heard `saved`
            journal.busy, journal.turn_id = True, f"t{next(self._turns)}"
            start: Event = {"type": "turn_start", "turn_id": journal.turn_id, "message_id": None}
            start.update(text=ev.text, channel=ev.channel, chat_id=ev.chat_id)
            start["provenance"] = ev.provenance  # "user": the person's message opened it
            if ev.files:
                start["files"] = list(ev.files)  # for clients that did not attach them
            journal.held = [start, {"type": "status", "state": "working"}]
            return held
        if ev.kind == "saved":
            if journal.held:
                journal.held[0]["message_id"] = ev.message_id
            held, journal.held = journal.held, []
            return held
        held, journal.held = journal.held, []
        return held + self._turn_events(journal, ev)

    def _turn_events(self, journal: Journal, ev: TurnEvent) -> list[Event]:
        if ev.kind in ("delta", "progress"):
            return [{"type": "delta", "text": ev.text}]
        if ev.kind == "reasoning":
            return [{"type": "reasoning", "text": ev.text}]
        if ev.kind == "tool_start" and ev.call is not None:
            call = ev.call
            start = {"type": "tool_start", "call_id": call.id, "name": call.name}
            return [{**start, "args": call.args}]
        if ev.kind == "tool_end" and ev.call is not None and ev.result is not None:
            return [_tool_end(ev)]
        if ev.kind in _STATES:
            status: Event = {"type": "status", "state": _STATES[ev.kind], "chat_id": ev.chat_id}
            if ev.kind == "retry":
                status.update(seconds=ev.seconds, text=ev.text)
            elif ev.kind == "restart":  # the text the new attempt replaces (heron run drops it)
                status.update(text=ev.text)
            elif ev.kind in ("mail", "queued") and ev.text:  # what was sent, and from where
                status.update(text=ev.text, channel=ev.channel)
            return [status]
        if ev.kind in ("approval", "approval_end") and ev.approval is not None:
            return [_approval(journal, ev.kind, ev.approval)]
        if ev.kind == "turn_end" and ev.end is not None:
            journal.approvals.clear()  # each ended with the turn at the latest (approvals.py)
            end = {**_turn_end(journal.turn_id, ev.end), "chat_id": ev.chat_id}
            if self.stopping and end["interrupted"] and not end["error"]:
                end["error"] = "heron serve stopped"
            usage = None if ev.end.usage_unknown else ev.end.usage  # not all counted: `?`
            if end["cost_usd"] is None and usage is not None and self.cost is not None:
                end["cost_usd"] = self.cost(usage)
            journal.busy, journal.turn_id = False, None
            return [end, {"type": "status", "state": "idle"}]
        return []


def _opens(item: Outbound) -> bool:
    """A turn's start, which this process emits before its turn waits for the lease."""
    return isinstance(item, TurnEvent) and item.kind == "turn_start"


def _approval(journal: Journal, kind: str, ask: ApprovalAsk) -> Event:
    """A command waiting for the person's answer, or how that wait ended (docs/web.md)."""
    if kind == "approval":
        event: Event = {"type": "approval", "id": ask.id, "tool": ask.tool}
        event.update(command=ask.command, deadline=round(ask.deadline, 3), confined=ask.confined)
        journal.approvals[ask.id] = event  # its seq is set as the journal appends it
        return event
    journal.approvals.pop(ask.id, None)
    end: Event = {"type": "approval_end", "id": ask.id, "allowed": ask.allowed}
    return {**end, "by": ask.by, "reason": ask.reason}


def _stays(event: Event, key: str) -> Event:
    """Another client's /resume, as a client that stays on `key` is sent it: the turn's end
    without `switch_to` (a switch is its sender's alone: this client's next message must land
    where it is), and the command's answer ("Resumed ...") as a note of where that one went."""
    if event["type"] != "message":
        return {**event, "switch_to": None}
    went = stopped_by("resume", event.get("channel"))
    said = f"{went} opened conversation {event['switch_to']!r} there; this one stays on {key!r}."
    return {**event, "text": said, "switch_to": None}


def _tool_end(ev: TurnEvent) -> Event:
    assert ev.call is not None and ev.result is not None
    return {
        "type": "tool_end",
        "call_id": ev.call.id,
        "name": ev.call.name,
        "result": ev.result.content,
        "is_error": ev.result.is_error,
        "seconds": round(ev.seconds, 3),
    }


def _turn_end(turn_id: str | None, end: TurnEnd) -> Event:
    usage = end.usage
    return {
        "type": "turn_end",
        "turn_id": turn_id,
        "outcome": end.outcome,
        "ok": end.ok,
        "error": end.error,
        "usage": {
            "input": usage.input if usage else 0,
            "output": usage.output if usage else 0,
            "cache_read": usage.cache_read if usage else 0,
            "cache_write": usage.cache_write if usage else 0,
        },
        "cost_usd": end.cost_usd,
        "interrupted": end.outcome == "stale",
        "stopped_by": end.stopped_by,
        "command": end.command,
        "switch_to": end.switch_to,
        "reply": end.reply,
        "run_id": end.run_id,
        "model_calls": end.model_calls,
        "unsaved": end.unsaved,
        "stop": end.stop,
        "usage_unknown": end.usage_unknown,
    }
