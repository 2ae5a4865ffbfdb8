"""Notes between the face and the workers, over PostgreSQL's LISTEN/NOTIFY on the cluster's
channel: what a turn streams (for the face's clients), a turn's start and end (for the face's
bookkeeping and end-of-turn hooks), and /stop (for the worker running that conversation).

A note is one JSON object. PostgreSQL caps a NOTIFY payload at 8,000 bytes, so a longer one
goes as numbered pieces (`P|id|i|n|text`) that the listener joins; one sender's notifications
arrive in the order sent. Notes are not durable: a face that was down misses them, and the
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
Note = dict[str, Any]
log = logging.getLogger(__name__)


def pieces(payload: str) -> list[str]:
    if len(payload) <= PIECE:
        return [payload]
    tag = uuid.uuid4().hex[:12]
    parts = [payload[i : i + PIECE] for i in range(0, len(payload), PIECE)]
    return [f"P|{tag}|{i}|{len(parts)}|{p}" for i, p in enumerate(parts)]


class Publisher:
    """Sends notes on one connection of its own (serialized: the pieces stay in order)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def send(self, note: Note) -> None:
        payload = json.dumps(note)
        async with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(
                    self.cluster.url, autocommit=True
                )
            for piece in pieces(payload):
                await records.notify_async(self._conn, self.cluster.channel, piece)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


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
                note = self._join(n.payload)
                if note is None:
                    continue
                try:
                    done = self.on_note(note)
                    if asyncio.iscoroutine(done):
                        await done
                except Exception:  # one bad note must not stop the stream
                    log.exception("a note could not be handled")

    def _join(self, payload: str) -> Note | None:
        if not payload.startswith("P|"):
            return json.loads(payload)  # type: ignore[no-any-return]
        _, tag, i, n, text = payload.split("|", 4)
        got = self._partial.setdefault(tag, [None] * int(n))
        got[int(i)] = text
        if any(p is None for p in got):
            return None
        del self._partial[tag]
        return json.loads("".join(p for p in got if p is not None))  # type: ignore[no-any-return]


async def start_listener(listener: Listener) -> asyncio.Task[None]:
    """The listener's task, once it listens (no note sent after this returns is missed)."""
    task = asyncio.create_task(listener.run())
    waiter = asyncio.create_task(listener.ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()  # raises what stopped it
    return task


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
