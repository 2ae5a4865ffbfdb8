"""Notes between the face and the workers, over PostgreSQL's LISTEN/NOTIFY on the cluster's
channel: what a turn streams (for the face's clients), a turn's start and end (for the face's
bookkeeping and end-of-turn hooks), and /stop (for the worker running that conversation).

A note is one JSON object; notes given while the previous NOTIFY is on its way go together as
a JSON array. PostgreSQL caps a NOTIFY payload at 8,000 bytes, so a longer note goes as
numbered pieces (`P|id|i|n|text`) that the listener joins; one sender's notifications arrive
in the order sent. Notes are not durable: a face that was down misses them, and the
record (and DBOS's workflow status) stays the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from heron.scale import records
from heron.scale.cluster import Cluster

PIECE = 7000  # characters of one piece (ASCII: json.dumps escapes the rest)
RELISTEN_S = 0.5  # a listener whose connection was lost listens again after this, doubled
MAX_RELISTEN_S = 10.0  # up to this, while the server cannot be reached
Note = dict[str, Any]
log = logging.getLogger(__name__)


def pieces(payload: str) -> list[str]:
    if len(payload) <= PIECE:
        return [payload]
    tag = uuid.uuid4().hex[:12]
    parts = [payload[i : i + PIECE] for i in range(0, len(payload), PIECE)]
    return [f"P|{tag}|{i}|{len(parts)}|{p}" for i, p in enumerate(parts)]


class Publisher:
    """Sends notes on one connection of its own, in the order given. Notes given while a
    NOTIFY is on its way go together in the next one (a JSON array, up to `PIECE`
    characters): a streamed answer is a note per delta, and one round trip each would cost
    the worker more than the turn (bench/scale.py --answer-chars 1200 --events)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._waiting: list[tuple[str, asyncio.Future[None]]] = []
        self._sending: asyncio.Task[None] | None = None

    def post(self, note: Note) -> asyncio.Future[None]:
        """Queue `note`; the future is done once it is sent (or holds why it was not)."""
        return self.post_json(json.dumps(note))

    def post_json(self, payload: str) -> asyncio.Future[None]:
        """`post` for a note already encoded (one JSON object)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((payload, done))
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send_waiting())
        return done

    async def send(self, note: Note) -> None:
        """Send `note` after every note given before it."""
        await self.post(note)

    async def _send_waiting(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await self._notify([payload for payload, _ in batch])
            except Exception as error:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(error)
                continue
            for _, done in batch:
                if not done.done():
                    done.set_result(None)

    async def _notify(self, payloads: list[str]) -> None:
        try:
            await self._notify_once(payloads)
        except psycopg.Error:
            if self._conn is None or not self._conn.closed:
                raise  # the statement's own error, not a lost connection
            # The server dropped the connection (a restart): once more on a new one, so a
            # turn's note is not lost with it (and its workflow does not fail on it).
            await self._notify_once(payloads)

    async def _notify_once(self, payloads: list[str]) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self.cluster.url, autocommit=True)
        for payload in packed(payloads):
            for piece in pieces(payload):
                await records.notify_async(self._conn, self.cluster.channel, piece)

    async def close(self) -> None:
        if self._sending is not None:
            with contextlib.suppress(Exception):
                await self._sending
        if self._conn is not None:
            await self._conn.close()


def packed(payloads: list[str]) -> list[str]:
    """Notes as few payloads as fit: a JSON array of several up to `PIECE` characters; a note
    too long for one alone stays alone (then sent in pieces)."""
    out: list[str] = []
    group: list[str] = []
    size = 0
    for payload in payloads:
        if group and size + len(payload) + 1 > PIECE:
            out.append(_array(group))
            group, size = [], 0
        group.append(payload)
        size += len(payload) + 1
    if group:
        out.append(_array(group))
    return out


def _array(group: list[str]) -> str:
    return group[0] if len(group) == 1 else "[" + ",".join(group) + "]"


class Listener:
    """Hands every note on the cluster's channel to `on_note`, until cancelled."""

    def __init__(self, cluster: Cluster, on_note: Callable[[Note], Any]) -> None:
        self.cluster = cluster
        self.on_note = on_note
        self.ready = asyncio.Event()
        self._partial: dict[str, list[str | None]] = {}

    async def run(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.cluster.url, autocommit=True) as conn:
            await records.listen(conn, self.cluster.channel)
            self.ready.set()
            async for n in conn.notifies():
                for note in self._join(n.payload):
                    try:
                        done = self.on_note(note)
                        if asyncio.iscoroutine(done):
                            await done
                    except Exception:  # one bad note must not stop the stream
                        log.exception("a note could not be handled")

    def _join(self, payload: str) -> list[Note]:
        """The notes of one payload: one, several (an array), or none yet (a piece)."""
        if payload.startswith("P|"):
            whole = self._piece(payload)
            return [] if whole is None else self._join(whole)
        found = json.loads(payload)
        return found if isinstance(found, list) else [found]

    def _piece(self, payload: str) -> str | None:
        _, tag, i, n, text = payload.split("|", 4)
        got = self._partial.setdefault(tag, [None] * int(n))
        got[int(i)] = text
        if any(p is None for p in got):
            return None
        del self._partial[tag]
        return "".join(p for p in got if p is not None)


async def start_listener(listener: Listener) -> asyncio.Task[None]:
    """The listener's task, once it listens (no note sent after this returns is missed)."""
    task = asyncio.create_task(listener.run())
    waiter = asyncio.create_task(listener.ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()  # raises what stopped it
    return task


async def keep_listening(listener: Listener) -> asyncio.Task[None]:
    """`start_listener`, and the listener started again whenever its connection is lost (a
    server restart), after a back-off: a worker's /stop and mail notes are heard again once the
    server is back (the notes sent meanwhile are not: notes are not durable). Cancel the task
    to stop listening."""
    first = await start_listener(listener)
    return asyncio.create_task(_relisten(listener, first))


async def _relisten(listener: Listener, task: asyncio.Task[None]) -> None:
    wait = RELISTEN_S
    while True:
        try:
            await task
            return
        except psycopg.Error as error:
            if listener.ready.is_set():  # it listened until now: a new outage, a short wait
                wait = RELISTEN_S
            log.warning("listening for notes stopped (%s); listening again in %.1f s",
                        str(error).strip(), wait)  # fmt: skip
        listener.ready.clear()
        await asyncio.sleep(wait)
        wait = min(wait * 2, MAX_RELISTEN_S)
        task = asyncio.create_task(listener.run())


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
