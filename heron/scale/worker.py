"""`heron worker`: an Engine and an AgentLoop whose turns arrive as DBOS workflows.

Each inbound message is the workflow `heron_message`, enqueued once under the message's id on
the queue `heron_turns`, partitioned by conversation key with one turn per partition at a
time: whichever worker dequeues it runs the turn in its own AgentLoop, and no two turns of one
conversation ever overlap across workers. What the turn sends out goes to the face as notes
(heron/scale/notes.py).

A worker that dies mid-turn leaves its workflow PENDING under its executor id. Every worker
holds a PostgreSQL advisory lock for as long as it lives (heron/scale/records.py; taken again
after a server restart, or the worker exits: heron/scale/alive.py); the others look every
`SWEEP_S` for PENDING turns whose owner's lock is free, and hand them back to the queue (DBOS's
recovery). The workflow then runs again on a live worker, which finds the dead
attempt's turn row by its run id (heron/store/attempts.py) and continues that turn from the
record: the tool calls that finished kept from the engine's checkpoint (not run again), the
ones cut off marked interrupted, the model answering the same stored message, which is never
stored twice. A turn that had finished before the crash is not run again.

A worker's turns have what a serve's have: `ask_user` (the face's next message answers it, as
mail), goals (the nudge enqueued, `WorkerLoop.start_turn`), subagents (each one's turn a
workflow of its own, heron/scale/subagents.py) and approvals (asked of the face's clients
through the notes, heron/agent/approvals.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TextIO

import psycopg
from dbos import DBOS

from heron.agent.approvals import Approvals
from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop, TurnEnded
from heron.bus import Dispatcher, InboundMessage, MessageBus, Outbound, TurnEnd, TurnOptions
from heron.config import Settings
from heron.errors import FailureLog
from heron.proactive.ask import attach as attach_ask
from heron.proactive.goals import attach as attach_goals
from heron.proactive.subagents import TIMEOUT_S, offer_spawn, turn_failed
from heron.providers.base import Provider
from heron.scale import records
from heron.scale.alive import AliveMark, trusts_free_locks
from heron.scale.cluster import (
    POLL_S,
    QUEUE,
    WORKER_TURNS,
    WORKFLOW,
    Cluster,
    TurnQueue,
    cluster_of,
    enqueue_options,
    executor_id,
    message_id,
)
from heron.scale.notes import Listener, Note, Publisher, keep_listening, stop_task
from heron.scale.subagents import QueuedSubagents, announced_run, task_run
from heron.scale.wire import end_to_dict, inbound_from_dict, inbound_to_dict, outbound_to_json
from heron.store import attempts, runs
from heron.tools.registry import ToolRegistry

SWEEP_S = 1.0  # seconds between looks for a dead worker's turns
DRAIN_S = 60.0  # on SIGTERM: how long running turns may take to finish before the exit
FACE_S = 1.0  # seconds between looks for the heron serve that started this worker
log = logging.getLogger(__name__)


def run_base(workflow_id: str) -> str:
    """The run id of a workflow's first attempt (later ones add `.n`)."""
    return "run_" + hashlib.sha256(workflow_id.encode()).hexdigest()[:16]


@dataclass
class WorkerLoop(AgentLoop):
    """A worker's AgentLoop. Its turns arrive as workflows; a turn it starts itself (a goal's
    nudge) goes on the queue like any message: into its conversation's partition, behind
    what waits there, run by whichever worker is free and durable from then on."""

    continues_dead_turns: ClassVar[bool] = True  # a dead worker's turn goes on on another
    queue: TurnQueue | None = None
    lookup: AliveMark | None = None  # its connection reads DBOS's tables, for what waits
    dbos_schema: str = "dbos"
    _enqueues: set[asyncio.Task[None]] = field(default_factory=set)

    def run_here(self, message: InboundMessage) -> None:
        """The turn of a workflow this worker dequeued: in this loop."""
        super().start_turn(message)

    def start_turn(self, message: InboundMessage) -> None:
        key = self.resolve(message)
        message = dataclasses.replace(message, id=message.id or message_id(), key=key)
        task = asyncio.create_task(self._enqueue(key, message))
        self._enqueues.add(task)
        task.add_done_callback(self._enqueues.discard)

    async def _enqueue(self, key: str, message: InboundMessage) -> None:
        assert self.queue is not None and message.id is not None
        try:
            options = enqueue_options(message.id, key)
            await self.queue.enqueue_async(options, inbound_to_dict(message), None)
        except Exception:  # said, never silent: the goal waits for the next turn's end
            log.exception("enqueueing a turn of %s failed", key)

    async def flush(self) -> None:
        """Until the turns it started are on the queue."""
        while self._enqueues:
            await asyncio.wait(set(self._enqueues))

    def pending(self, key: str) -> int:
        """Messages waiting for the conversation: here, and in its partition of the queue (a
        person's message there goes before a goal's nudge, whose turn's end continues it)."""
        local = super().pending(key)
        if self.lookup is None:
            return local
        return local + records.queued_in(self.lookup.conn, self.dbos_schema, QUEUE, key)


class WorkerHost:
    """What the workflow function finds in this process: the loop its turns run in."""

    current: ClassVar[WorkerHost | None] = None

    def __init__(
        self,
        engine: Engine,
        cluster: Cluster,
        publisher: Publisher,
        queue: TurnQueue | None = None,
        lookup: AliveMark | None = None,
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.publisher = publisher
        self.bus = MessageBus()
        self.loop = WorkerLoop(
            engine, self.bus, queue=queue, lookup=lookup, dbos_schema=cluster.dbos_schema
        )
        # A goal's nudge streams to the face's clients like a person's turn, as in a serve
        # without workers.
        self.loop.heron_turn_events = True
        # ask_user waits in the worker's turn; the face hands the person's next message to it
        # as mail (`on_note`), which answers the question (AgentLoop.post_mail).
        attach_ask(self.loop)
        # Goals: the turn options and runtime line of a goal's conversation, /goal, the tool,
        # and the nudge after a turn's end, enqueued (`WorkerLoop.start_turn`).
        attach_goals(self.loop)
        # Commands that need approval are asked of the face's clients: the `approval` events go
        # as notes, the answer comes back as one (`on_note`).
        self.approvals = Approvals(self.bus)
        self.loop.approver_for = self.approvals.approver
        # Subagents: each one's turn a workflow of its own (heron/scale/subagents.py).
        self.subagents = QueuedSubagents(self.loop)
        offer_spawn(engine, self.subagents)
        self.subagent_timeout_s = TIMEOUT_S
        if lookup is not None:  # /status says how many workers the store has alive
            engine.attached.status_lines = functools.partial(_workers_alive, lookup, cluster)
        self.dispatcher = Dispatcher(self.bus)
        self.dispatcher.register("*", self._relay)
        self.loop.watch_turns(self._turn_ended)
        self._ends: dict[str, asyncio.Future[TurnEnded]] = {}

    async def _relay(self, out: Outbound) -> None:
        """Everything the loop sends out, to the face's clients, in order: posted, not awaited,
        so that what a turn streams meanwhile goes in the same NOTIFY (a delta each)."""
        self.publisher.post_json(outbound_to_json(out)).add_done_callback(_said_if_lost)

    def _turn_ended(self, ended: TurnEnded) -> None:
        waiting = self._ends.pop(ended.message.id or "", None)
        if waiting is not None and not waiting.done():
            waiting.set_result(ended)

    async def handle(
        self, workflow_id: str, envelope: dict[str, Any], mail_into: str | None = None
    ) -> dict[str, Any]:
        """One workflow: the message's turn (or the rest of it), to its end; nothing when the
        turn it was mailed into (`mail_into`) took it."""
        message = inbound_from_dict(envelope)
        key = self.loop.resolve(message)
        if mail_into is not None and await self._was_mailed(key, mail_into, workflow_id):
            end = TurnEnd(True, "mail")
            await self.publisher.send({**_ended_note(workflow_id, key, end), "mail": True})
            return end_to_dict(end)
        options = await self._attempt(workflow_id, message.options)
        if options is None:  # its turn ended before a worker died: only its aftermath left
            await self._after(message, None, False)
            end = TurnEnd(True, "recovered")
            await self.publisher.send(_ended_note(workflow_id, key, end))
            return end_to_dict(end)
        message = dataclasses.replace(message, id=workflow_id, key=key, options=options)
        await self.publisher.send({"t": "started", "wid": workflow_id, "key": key})
        log.info("turn %s of %s: started (run %s)", workflow_id, key, options.run_id)
        ended, timed_out = await self._run(message)
        await self.bus.outbound.join()  # the turn's last events reach the face before its end
        await self._after(message, ended, timed_out)
        _log_end(workflow_id, key, ended.end)
        await self.publisher.send(_ended_note(workflow_id, key, ended.end))
        return end_to_dict(ended.end)

    async def _run(self, message: InboundMessage) -> tuple[TurnEnded, bool]:
        """The message's turn in this loop, to its end; a subagent's stopped at its timeout
        (True then), as in one process."""
        assert message.id is not None and message.key is not None
        ended: asyncio.Future[TurnEnded] = asyncio.get_running_loop().create_future()
        self._ends[message.id] = ended
        self.loop.run_here(message)
        if task_run(message) is None:
            return await ended, False
        clock = asyncio.create_task(asyncio.sleep(self.subagent_timeout_s))
        waits: set[asyncio.Future[Any]] = {ended, clock}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not ended.done():  # the wall clock ran out: stop it, keep what it did
                await self.loop.stop(message.key)
        finally:
            clock.cancel()
        return await ended, clock.done() and not clock.cancelled()

    async def _after(
        self, message: InboundMessage, ended: TurnEnded | None, timed_out: bool
    ) -> None:
        """What a turn's end settles beyond the turn: a subagent's result recorded and
        announced; an announcement (or its retry) marked delivered once answered, else
        retried once; the results owed in a conversation whose turn ended well settled."""
        task = task_run(message)
        if task is not None:
            await self.subagents.finish(task[0], task[1], ended, timed_out)
        announced = announced_run(message)
        if announced is not None:
            await self.subagents.announced(announced, ended)
        elif ended is not None and message.key is not None and not turn_failed(ended.end):
            await self.subagents.settle_owed(message.key)

    async def _attempt(self, workflow_id: str, given: TurnOptions | None) -> TurnOptions | None:
        """The options of this attempt: the first, the continuation of a dead worker's, or
        None when the turn already ended."""
        store = self.engine.store
        base = run_base(workflow_id)
        last = await store.call(attempts.latest, store, base)
        options = given or TurnOptions()
        if last is None:
            return dataclasses.replace(options, run_id=base)
        if not last.open:
            return None
        run_id = attempts.run_id_of(base, last.number + 1)
        return dataclasses.replace(options, run_id=run_id, answer_id=last.user_message_id)

    async def _was_mailed(self, key: str, into: str, workflow_id: str) -> bool:
        """Whether the turn of `into` took this message: as mail, or as the answer to the
        question it waited on."""
        store = self.engine.store
        if await store.call(attempts.holds_mail, store, key, run_base(into), workflow_id):
            return True
        return await store.call(runs.answered_with, store, key, workflow_id)

    async def on_note(self, note: Note) -> None:
        """From a face: /stop (stop the conversation's turn if it runs here); mail for a turn
        that runs here (into its mailbox)."""
        kind = note.get("t")
        if kind == "stop" and self.loop.running(str(note["key"])):
            await self.loop.stop(str(note["key"]))
        elif kind == "mail":
            self.loop.post_mail(inbound_from_dict(note["message"]), str(note["into"]))
        elif kind == "approve":  # ignored unless the approval waits here
            key, approval_id = str(note["key"]), str(note["id"])
            self.approvals.answer(key, approval_id, bool(note["allow"]), str(note["by"]))


async def _workers_alive(mark: AliveMark, cluster: Cluster) -> list[str]:
    """/status on a worker: the store's live workers (one statement on the worker's own
    connection, inline as `WorkerLoop.pending`)."""
    alive = records.count_alive(mark.conn, cluster.schema)
    return [f"workers: {alive} alive on this store (this answer from pid {os.getpid()})"]


def _log_end(workflow_id: str, key: str, end: TurnEnd) -> None:
    if end.ok:
        log.info("turn %s of %s: %s", workflow_id, key, end.outcome)
    else:  # always said: a worker whose turns fail must not look idle
        log.warning("turn %s of %s: %s: %s", workflow_id, key, end.outcome, end.error)


def _said_if_lost(sent: asyncio.Future[None]) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.warning("a turn's event did not reach the face: %s", sent.exception())


def _ended_note(workflow_id: str, key: str, end: TurnEnd) -> Note:
    return {"t": "ended", "wid": workflow_id, "key": key, "end": end_to_dict(end)}


@DBOS.workflow(name=WORKFLOW)
async def heron_message(envelope: dict[str, Any], mail_into: str | None = None) -> dict[str, Any]:
    host = WorkerHost.current
    if host is None:
        raise RuntimeError("heron_message runs only in a heron worker")
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None
    return await host.handle(workflow_id, envelope, mail_into)


def dbos_config(cluster: Cluster, executor: str) -> dict[str, Any]:
    return {
        "name": "heron",
        "system_database_url": cluster.dbos_url,
        "dbos_system_schema": cluster.dbos_schema,
        "executor_id": executor,
        "run_admin_server": False,
        "log_level": "WARNING",
        "notification_listener_polling_interval_sec": 0.05,
    }


async def run_worker(
    settings: Settings,
    *,
    model: str | None = None,
    provider: Provider | None = None,
    registry: ToolRegistry | None = None,
    out: TextIO | None = None,
    worker_turns: int = WORKER_TURNS,
    until: asyncio.Event | None = None,
    verbose: bool = False,
    face: int | None = None,
) -> None:
    """Run turns from the queue until SIGINT/SIGTERM (or `until`, or the end of `face`, the
    pid of the `heron serve` that started this worker); then let running turns finish (up to
    DRAIN_S) and exit."""
    out = sys.stdout if out is None else out  # read now: a caller may have swapped it
    _log_to_stderr(logging.INFO if verbose else logging.WARNING)
    cluster = cluster_of(settings.database)
    executor = executor_id()
    alive = AliveMark(cluster.url, cluster.schema, executor)
    try:
        await asyncio.to_thread(alive.take)
        async with Engine.open(
            settings, model=model, provider=provider, registry=registry
        ) as engine:
            await _serve_queue(engine, cluster, executor, alive, out, worker_turns, until, face)
    finally:
        alive.close()


def _log_to_stderr(level: int) -> None:
    """The worker's own lines (turns failed or recovered; with --verbose every turn) on
    stderr, each naming its process: several workers often share one terminal or journal."""
    logger = logging.getLogger("heron.scale")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"heron worker {os.getpid()}: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)


async def _serve_queue(
    engine: Engine,
    cluster: Cluster,
    executor: str,
    alive: AliveMark,
    out: TextIO,
    worker_turns: int,
    until: asyncio.Event | None,
    face: int | None,
) -> None:
    from dbos import DBOSClient

    publisher = Publisher(cluster)
    host = WorkerHost(engine, cluster, publisher, lookup=alive)
    WorkerHost.current = host
    stop = until or asyncio.Event()
    undo = _on_signals(stop.set) if until is None else (lambda: None)
    dispatching = asyncio.create_task(host.dispatcher.run())
    watching = asyncio.create_task(_watch_face(face, stop)) if face is not None else None
    listening: asyncio.Task[None] | None = None
    sweeping: asyncio.Task[None] | None = None
    client: DBOSClient | None = None
    DBOS(config=dbos_config(cluster, executor))  # type: ignore[arg-type]
    try:
        # On this thread, so that DBOS runs the workflows on this event loop, where the
        # AgentLoop and its connections live (from another thread it would use a loop of its
        # own). It blocks while DBOS migrates its schema: once, at start.
        DBOS.launch()
        await DBOS.register_queue_async(
            QUEUE,
            partition_concurrency=1,
            worker_concurrency=worker_turns,
            polling_interval_sec=POLL_S,
        )
        host.loop.queue = client = await asyncio.to_thread(
            DBOSClient, system_database_url=cluster.dbos_url, dbos_system_schema=cluster.dbos_schema
        )
        listening = await keep_listening(Listener(cluster, host.on_note))
        sweeping = asyncio.create_task(_sweep(cluster, executor))
        host.loop.relays.sweep()  # background work's messages a dead process left waiting
        out.write(f"heron worker: ready ({executor}, {engine.choice.provider}/"
                  f"{engine.choice.model})\n")  # fmt: skip
        out.flush()
        await stop.wait()
    finally:
        undo()
        await stop_task(watching)
        await stop_task(sweeping)
        # DBOS stops dequeuing, then waits for this worker's workflows to finish, output
        # recorded (they run on this loop, free meanwhile); a turn still running after
        # DRAIN_S is stopped below, as Ctrl-C stops a serve's turns.
        drain = functools.partial(DBOS.destroy, workflow_completion_timeout_sec=int(DRAIN_S))
        await asyncio.to_thread(drain)
        await stop_task(listening)
        await host.loop.close()
        await host.loop.flush()  # the nudges of the last turns' ends, on the queue
        if client is not None:
            client.destroy()  # DBOS.destroy shut the loop's default executor down
        await stop_task(dispatching)
        await publisher.close()
        WorkerHost.current = None


async def _sweep(cluster: Cluster, executor: str) -> None:
    """Hand the turns of dead workers back to the queue (see the module docstring)."""
    conn = await asyncio.to_thread(_connect, cluster.url)
    failures = FailureLog(log, "looking for dead workers")  # once per outage, not a second
    try:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                if conn.closed:  # lost with the server (a restart): made again
                    conn = await asyncio.to_thread(_connect, cluster.url)
                dead = await asyncio.to_thread(_dead_owners, conn, cluster, executor)
                if dead:
                    log.warning("recovering the turns of %s", ", ".join(dead))
                    await asyncio.to_thread(DBOS._recover_pending_workflows, dead)
            except psycopg.Error:
                failures.failed()
                continue
            failures.worked()
    finally:
        conn.close()


async def _watch_face(face: int, stop: asyncio.Event) -> None:
    """A worker of `heron serve --workers N` ends with its serve. A serve killed with -9 has
    no time to send SIGTERM: its workers are re-parented, and would run on beside the next
    serve's own. So when the parent is no longer `face`, this one stops as on SIGTERM."""
    while os.getppid() == face:
        await asyncio.sleep(FACE_S)
    log.warning("the heron serve that started this worker (pid %d) is gone: stopping", face)
    stop.set()


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def _dead_owners(conn: psycopg.Connection[Any], cluster: Cluster, executor: str) -> list[str]:
    """The workers other than this one that own a turn in flight and hold no alive mark; none
    while the server is new (heron/scale/alive.py): a restart freed every mark, of live
    workers too, and they take theirs again within that time."""
    owners = [
        o for o in records.owners_in_flight(conn, cluster.dbos_schema, QUEUE) if o != executor
    ]
    if not owners or not trusts_free_locks(conn):
        return []
    return [o for o in owners if records.is_dead(conn, cluster.schema, o)]


def _on_signals(callback: Callable[[], None]) -> Callable[[], None]:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, callback)

    def undo() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    return undo


__all__ = ["WorkerHost", "run_base", "run_worker"]
