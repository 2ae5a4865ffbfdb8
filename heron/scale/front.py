"""The face of `heron serve --workers N`: an AgentLoop whose turns run on the workers.

`FrontLoop` keeps the AgentLoop's interface (the web app, the control socket, the hub and the
background services all talk to it as to the in-process loop) but enqueues each message as a
DBOS workflow instead of starting a turn. Its view of what runs comes from the workers' notes:
a turn's start and end, and everything the turn streams, which it puts on its own bus for the
hub. /stop and /status for a conversation running on a worker answer at once: /stop cancels
the workflow, bumps the conversation's epoch (whatever the turn still tries to commit is
discarded) and tells the worker, which stops the turn as the in-process /stop does.

A message for a conversation whose turn runs on a worker is queued behind it in its
partition, and offered to that turn as mail (a note to the worker): the worker takes it into
the turn's mailbox, and the turn stores it with its id (`Mail`), in the same commit as the rest
of the user message it rides in. When its own workflow comes up, the worker finds it stored
and ends it at once; if the turn never read it (it had passed its last drain, was stopped, or
its worker died before the commit), the workflow opens the next turn with it. So a follow-up
is answered in the running turn when it can be, and never lost or answered twice. Subagents
run their turns in the face's own engine (`run_turn`), as in one process.

When no worker is alive (`Census`: the face's own workers, heron/scale/spawn.py, else any of
the store's on the database), a message is still queued, and its sender is told at once: a
notice saying why, and when one of the face's workers is on its way, that it runs then; when
none is coming, the notice has the code "no_worker" and a client waiting for the turn stops
waiting. The messages already waiting are told the same when the last worker dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg

from heron.agent import commands
from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop, TurnEnded, mailable
from heron.bus import InboundMessage, MessageBus, OutboundMessage, stopped_by
from heron.config import Settings
from heron.messages import Message
from heron.proactive.goals import Goals
from heron.scale import records
from heron.scale.cluster import (
    QUEUE,
    Cluster,
    TurnQueue,
    cluster_of,
    enqueue_options,
    message_id,
)
from heron.scale.notes import Listener, Note, Publisher, start_listener
from heron.scale.polling import PollGovernor
from heron.scale.spawn import Staff, workers
from heron.scale.wire import end_from_dict, inbound_to_dict, outbound_from_dict
from heron.store import engine_state as es
from heron.store import goals

log = logging.getLogger(__name__)
Service = Callable[[AgentLoop], Awaitable[None]]
NO_WORKER = "no_worker"  # the code of a notice that no worker will take the message soon
NEXT_STEP = (
    "It stays queued and runs when a worker starts: restart heron serve --workers N, or start "
    "`heron worker` with this home's settings (docs/scale.md). Do not send it again."
)


@dataclass
class Census:
    """Whether a worker is alive to take a message: one of the face's own (`staff`), else
    any of the store's on the database (each holds its lock there, records.count_alive)."""

    cluster: Cluster
    staff: Staff | None = None
    _conn: psycopg.Connection[Any] | None = None

    async def absent(self) -> tuple[str, bool] | None:
        """None when a worker is alive; else why none is, and whether one of the face's is
        on its way (starting, or restarting after a backoff)."""
        if self.staff is not None and self.staff.alive:
            return None
        try:  # the face's own dead worker may still hold its lock for an instant: not counted
            if await asyncio.to_thread(self._count) > 0:
                return None  # workers of this store elsewhere (`heron worker`, other hosts)
        except psycopg.Error:
            log.warning("could not count the workers alive", exc_info=True)
            return None  # unknown: say nothing rather than something false
        if self.staff is None:
            return "no worker is running: none of this store's holds its lock", False
        return f"no worker is running: {self.staff.absent()}", self.staff.coming

    async def lines(self) -> list[str]:
        """/status on the face (while a worker's turn runs there)."""
        if self.staff is None:
            return []
        return [f"workers: {self.staff.summary()}"]

    def _count(self) -> int:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.cluster.url, autocommit=True)
        own = self.staff.executors if self.staff is not None else []
        return records.count_alive(self._conn, self.cluster.schema, own)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@dataclass
class FrontLoop(AgentLoop):
    continues_dead_turns: ClassVar[bool] = True  # a dead worker's turn goes on on another
    queue: TurnQueue | None = None
    publisher: Publisher | None = None
    listening: asyncio.Event = field(default_factory=asyncio.Event)
    _remote: dict[str, str] = field(default_factory=dict)  # conversation -> running workflow
    _waiting: dict[str, InboundMessage] = field(default_factory=dict)  # enqueued, not ended
    _tasks: set[asyncio.Future[None]] = field(default_factory=set)
    # Per conversation, its last enqueue still in flight (the next one waits for it).
    _enqueues: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    governor: PollGovernor | None = None  # the workers' polling, slowed while idle
    census: Census | None = None  # whether a worker is alive to take what is queued
    # Messages told no worker is alive: True once told one is coming, False none is.
    _told: dict[str, bool] = field(default_factory=dict)

    def quiet(self) -> bool:
        """Nothing runs or waits here, nor on a worker for this face."""
        return not (self._active or self._waiting or self._remote)

    # ---- what the rest of the serve asks -------------------------------------------------

    def running(self, key: str) -> bool:
        return key in self._active or key in self._remote

    @property
    def busy(self) -> bool:
        return bool(self._active or self._remote)

    def user_turn_running(self) -> bool:
        remote = any(m.provenance == "user" for m in self._waiting.values())
        return remote or super().user_turn_running()

    def pending(self, key: str) -> int:
        return sum(1 for m in self._waiting.values() if m.key == key) - (key in self._remote)

    async def wait_idle(self) -> None:
        while self._active or self._waiting or any(self._pending.values()):
            self._idle.clear()
            await self._idle.wait()

    # ---- messages in -----------------------------------------------------------------------

    async def dispatch(self, message: InboundMessage) -> None:
        key = self.resolve(message)
        if key in self._active:  # a turn of this process (a subagent's) runs there
            await super().dispatch(message)
            return
        found = commands.parse(message.text)
        if found is not None and found.name in commands.PRIORITY and key in self._remote:
            await self._remote_priority(found, key, message)
            return
        into = self._remote.get(key) if found is None and mailable(message) else None
        self._submit(key, message, into)  # the next message need not wait for the round trip

    async def enqueue(
        self, key: str, message: InboundMessage, *, mail_into: str | None = None
    ) -> None:
        """The message as a workflow in its conversation's partition, once (by its id). With
        `mail_into` (the workflow of the turn running there) it is also offered to that turn
        as mail; the worker running it tells the channel "mail" or "queued"."""
        await self._submit(key, message, mail_into)

    def _submit(
        self, key: str, message: InboundMessage, mail_into: str | None = None
    ) -> asyncio.Future[None]:
        """Admit the message now (waiting from here on; "queued" when a turn runs there) and
        enqueue it in the background: conversations concurrently (each enqueue is a round trip,
        in a thread of DBOS's client), each conversation's messages one after the other, since
        DBOS orders a partition by the time of the insert."""
        workflow_id = message.id or message_id()
        message = dataclasses.replace(message, id=workflow_id, key=key)
        if key in self._remote and mail_into is None:
            self._event(message, key, "queued")
        self._waiting[workflow_id] = message
        self._idle.clear()
        task = asyncio.ensure_future(
            self._enqueue_after(self._enqueues.get(key), key, message, mail_into)
        )
        self._enqueues[key] = task
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._enqueued(key, t))
        return task

    def _enqueued(self, key: str, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if self._enqueues.get(key) is task:
            del self._enqueues[key]

    async def _enqueue_after(
        self,
        before: asyncio.Future[None] | None,
        key: str,
        message: InboundMessage,
        mail_into: str | None,
    ) -> None:
        assert self.queue is not None and self.publisher is not None and message.id
        if before is not None:
            await asyncio.wait({before})  # its own failure is told by its own task
        await self.listening.wait()  # the end of its turn must not pass unheard
        envelope = inbound_to_dict(message)
        try:
            if self.governor is not None:
                await self.governor.busy()  # the workers polling fast before it is queued
            await self.queue.enqueue_async(enqueue_options(message.id, key), envelope, mail_into)
        except Exception as error:  # the database is out of reach: say so, hold nothing
            log.exception("enqueueing a message of %s failed", key)
            self._waiting.pop(message.id, None)
            if not self._waiting and not self._active:
                self._idle.set()
            await self._send(message, key, f"The message could not be queued: {error}", "error")
            return
        if mail_into is not None:  # after the enqueue: unheard or refused, it still runs
            await self.publisher.send({"t": "mail", "into": mail_into, "message": envelope})
        await self._tell_if_unstaffed([message])

    # ---- no worker alive ------------------------------------------------------------------

    def workers_changed(self) -> None:
        """The face's workers changed (heron/scale/spawn.py): when none is alive any more,
        what waits is told so."""
        if self.census is None or self.census.staff is None or self.census.staff.alive:
            return
        task = asyncio.ensure_future(self._tell_if_unstaffed(list(self._waiting.values())))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tell_if_unstaffed(self, messages: list[InboundMessage]) -> None:
        """Each sender told, once for each of the two cases, that no worker is alive."""
        if self.census is None or not messages:
            return
        absent = await self.census.absent()
        if absent is None:
            return
        why, coming = absent
        for message in messages:
            assert message.id is not None and message.key is not None
            if message.id not in self._waiting or self._told.get(message.id) == coming:
                continue
            self._told[message.id] = coming
            if coming:
                text, code = f"heron: {why}; your message is queued and runs then.", None
            else:
                text, code = f"heron: {why}.\n{NEXT_STEP}", NO_WORKER
            notice = OutboundMessage(message.channel, message.chat_id, message.key, text,
                                     "notice", code)  # fmt: skip
            await self.bus.send(notice)

    async def _remote_priority(
        self, found: commands.Command, key: str, message: InboundMessage
    ) -> None:
        if found.name == "new":  # the running turn stops; /new runs next in the partition
            await self.stop(key, stopped_by("new", message.channel))
            self._submit(key, message)
            return
        await self._command_now(found, key, message)

    def start_turn(self, message: InboundMessage) -> None:
        key = self.resolve(message)
        if key in self._active:
            super().start_turn(message)
        else:
            self._submit(key, message)

    def announce(self, message: InboundMessage, injected: Message) -> str:
        key = self.resolve(message)
        if key in self._active:
            return super().announce(message, injected)
        self._submit(key, message)
        return "turn"

    # ---- interrupts ------------------------------------------------------------------------

    async def stop(self, key: str, by: str | None = None) -> bool:
        if key in self._active:
            return await super().stop(key, by)
        workflow_id = self._remote.get(key)
        if workflow_id is None:
            return False
        assert self.queue is not None and self.publisher is not None
        await self.queue.cancel_workflow_async(workflow_id)  # never recovered, never resumed
        store = self.engine.store
        conversation = await store.call(store.conversation, key)
        if conversation is not None:
            await store.call(es.bump_epoch, store, conversation.id, by)
        await self.publisher.send({"t": "stop", "key": key})
        return True

    async def answer_elsewhere(self, key: str, approval_id: str, allow: bool, by: str) -> bool:
        """An answer to an approval a worker's turn waits on (its `approval` event came as a
        note): to the workers, where the one waiting takes it."""
        if key not in self._remote:
            return False
        assert self.publisher is not None
        note = {"t": "approve", "key": key, "id": approval_id, "allow": allow, "by": by}
        await self.publisher.send(note)
        return True

    # ---- notes from the workers ------------------------------------------------------------

    def on_note(self, note: Note) -> None:
        kind = note.get("t")
        if kind in ("event", "out"):
            self.bus.emit(outbound_from_dict(note))
        elif kind == "started":
            self._remote[str(note["key"])] = str(note["wid"])
        elif kind == "ended":
            mailed = bool(note.get("mail"))
            self._ended_remote(str(note["wid"]), str(note["key"]), note["end"], mailed)

    def _ended_remote(
        self, workflow_id: str, key: str, end: dict[str, Any], mailed: bool = False
    ) -> None:
        if self._remote.get(key) == workflow_id:
            del self._remote[key]
        message = self._waiting.pop(workflow_id, None)
        self._told.pop(workflow_id, None)
        if not self._waiting and not self._active:
            self._idle.set()
        if message is None or mailed:  # another face's message; mail, answered in a turn
            return
        ended = TurnEnded(key, message, end_from_dict(end), None)
        for hook in list(self.turn_end_hooks):
            try:
                hook(ended)
            except Exception:
                log.exception("an end-of-turn hook failed for %s", key)


def listener_service(cluster: Cluster) -> Callable[[AgentLoop], Awaitable[None]]:
    """The face's listener, as a background service of the serve's Runtime: the workers'
    notes reach the FrontLoop, which enqueues nothing before it listens."""

    async def listen(loop: AgentLoop) -> None:
        assert isinstance(loop, FrontLoop)
        listener = Listener(cluster, loop.on_note)
        task = await start_listener(listener)
        loop.listening.set()
        await task

    return listen


def goals_service(cluster: Cluster) -> Service:
    """At the face's start, the active goals no turn works on go on, as in a serve without
    workers: a nudge enqueued for each whose conversation has nothing running or queued,
    under an id made of the goal's and its turns used, so that faces starting at once
    enqueue it once (DBOS returns the first for a workflow id it holds)."""

    async def resume(loop: AgentLoop) -> None:
        assert isinstance(loop, FrontLoop)
        await loop.listening.wait()
        store, manager = loop.engine.store, Goals(loop)
        keys = await store.call(goals.active_keys, store)
        busy = await asyncio.to_thread(_busy, cluster, keys) if keys else set()
        for key in keys:
            goal = await store.call(goals.open_goal, store, key)
            if goal is None or goal.status != "active" or key in busy:
                continue  # a turn there, or a message waiting there, continues it
            manager.continue_goal(key, goal, nudge_id=f"goal-{goal.id}-{goal.turns_used}")

    return resume


def _busy(cluster: Cluster, keys: list[str]) -> set[str]:
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        return records.busy_partitions(conn, cluster.dbos_schema, QUEUE, keys)


def governor_service(governor: PollGovernor) -> Service:
    """The governor's idle watch, as a background service of the serve's Runtime."""

    async def watch(loop: AgentLoop) -> None:
        assert isinstance(loop, FrontLoop)
        await governor.run(loop.quiet)

    return watch


async def polled_queue(client: Any) -> PollGovernor | None:
    """A governor of the queue the workers registered (None, said, when none has yet)."""
    queue = await client.retrieve_queue_async(QUEUE)
    if queue is None:
        log.warning("no worker has registered the queue yet: its polling stays as they set it")
        return None
    return PollGovernor(queue)


@contextlib.asynccontextmanager
async def front(
    settings: Settings, n: int, model: str | None = None
) -> AsyncIterator[tuple[Callable[[Engine, MessageBus], AgentLoop], list[Service], Staff]]:
    """What `heron serve --workers N` runs its face with: N workers started and kept alive
    (the `Staff`), the loop that enqueues for them and the service that listens to them. A
    clear error on SQLite."""
    from dbos import DBOSClient

    cluster = cluster_of(settings.database)
    async with workers(n, model) as staff:
        census = Census(cluster, staff)
        client = await asyncio.to_thread(
            DBOSClient, system_database_url=cluster.dbos_url, dbos_system_schema=cluster.dbos_schema
        )
        publisher = Publisher(cluster)
        governor = await polled_queue(client)
        services = [listener_service(cluster), goals_service(cluster)]
        if governor is not None:
            services.append(governor_service(governor))

        def make(engine: Engine, bus: MessageBus) -> AgentLoop:
            loop = FrontLoop(
                engine, bus, queue=client, publisher=publisher, governor=governor, census=census
            )
            staff.listeners.append(loop.workers_changed)
            engine.attached.status_lines = census.lines
            return loop

        try:
            yield make, services, staff
        finally:
            await publisher.close()
            await asyncio.to_thread(client.destroy)
            census.close()
