"""A worker's alive mark: a session advisory lock on a connection of its own
(heron/scale/records.py), which the other workers' sweeps try to take to learn it is dead.

A PostgreSQL restart drops every session, so every live worker's mark at once: a sweep that
trusted a free lock then would take live workers for dead and run their turns a second time
(tools twice, replies doubled). Two rules keep that from happening:

- A sweep trusts a free lock only once the server has been up `RESTART_GRACE_S`
  (`trusts_free_locks`): for that long after a start, every lock may be free because a live
  worker has not taken its own again yet.
- A live worker looks at its mark every `MARK_S` (`AliveMark`, on a thread of its own, so that
  a busy event loop cannot delay it). When the connection is gone it opens another and takes
  the lock again, and keeps it only if the server has been up less than `RESTART_GRACE_S`:
  later, a sweep may already have handed its turns to another worker. A worker that cannot
  take its mark again within `LOST_S` of finding it lost, or takes it too late, exits at once
  (`os._exit`, as kill -9 would: the record keeps what its turns did, and another worker
  continues them); `heron serve --workers` starts a new one.

`LOST_S` plus `MARK_S` is well below `RESTART_GRACE_S`: the worker is gone before any sweep may
take it for dead. What these rules do not cover (docs/scale.md, "Not yet"): a worker whose
connection alone is cut while the server stays up, and a server that restarts its sessions
after a crash of one of them without restarting itself; such a worker may run on beside the
one continuing its turns until its next look (`MARK_S`), then exits.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from heron.scale import records

RESTART_GRACE_S = 10.0  # after the server starts, no sweep takes a free lock for a dead worker
MARK_S = 0.5  # seconds between a worker's looks at its own mark
LOST_S = 6.0  # a mark lost and not taken again within this: the worker exits
CONNECT_TIMEOUT_S = 3  # one try to connect (the deadline above ends a worker whatever it does)
RETRY_S = 0.25  # between tries to connect again, while the server is down
EXIT_MARK_LOST = 75  # EX_TEMPFAIL: the worker exited for its mark; started again, it is fine
log = logging.getLogger(__name__)


def trusts_free_locks(conn: psycopg.Connection[Any]) -> bool:
    """Whether a free lock now means a dead worker: the server has been up long enough for
    every live worker to have taken its mark again after the server's start."""
    return records.server_uptime(conn) >= RESTART_GRACE_S


def exit_now() -> None:
    """The worker ends at once, its turns with it (as kill -9 ends it)."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(EXIT_MARK_LOST)


class AliveMark:
    """This worker's mark, held from `take` to `close`, taken again after a server restart
    (see the module docstring). `conn` is also the worker's connection for small reads of
    its own (`WorkerLoop.pending`, /status): the one that works now."""

    def __init__(
        self,
        url: str,
        schema: str,
        executor: str,
        on_lost: Callable[[], None] = exit_now,
    ) -> None:
        self.url, self.schema, self.executor = url, schema, executor
        self.on_lost = on_lost
        self.taken_again = 0  # times the mark was taken again on a new connection
        self._conn: psycopg.Connection[Any] | None = None
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        assert self._conn is not None, "AliveMark.take first"
        return self._conn

    def take(self) -> None:
        """Take the mark (blocking: call it off the event loop) and start keeping it."""
        self._conn = self._locked()
        self._keeper = threading.Thread(target=self._keep, name="heron-alive-mark", daemon=True)
        self._keeper.start()

    def close(self) -> None:
        """Stop keeping the mark and give it back (the connection's end frees the lock)."""
        self._stop.set()
        if self._keeper is not None:  # a look under way ends within CONNECT_TIMEOUT_S
            self._keeper.join(CONNECT_TIMEOUT_S + MARK_S)
        if self._conn is not None:
            self._conn.close()

    def _locked(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        try:
            records.hold_alive(conn, self.schema, self.executor)
        except BaseException:
            conn.close()
            raise
        return conn

    def _keep(self) -> None:
        while not self._stop.wait(MARK_S):
            try:
                records.ping(self.conn)
            except psycopg.Error:
                self._take_again()

    def _take_again(self) -> None:
        """The connection is gone and the lock with it: a new one, the lock on it, within
        `LOST_S`, or the worker ends."""
        log.warning("the database connection holding this worker's alive mark was lost")
        deadline = threading.Timer(LOST_S, self._give_up, (f"not taken again in {LOST_S:.0f} s",))
        deadline.daemon = True
        deadline.start()
        try:
            while not self._stop.is_set():
                try:
                    conn = self._locked()
                    uptime = records.server_uptime(conn)
                except psycopg.Error:
                    self._stop.wait(RETRY_S)
                    continue
                self._swap(conn, uptime)
                return
        finally:
            deadline.cancel()

    def _swap(self, conn: psycopg.Connection[Any], uptime: float) -> None:
        if uptime >= RESTART_GRACE_S:  # a sweep may have taken this worker for dead already
            conn.close()
            self._give_up(f"taken again only {uptime:.0f} s after the server started")
            return
        old, self._conn = self._conn, conn
        if old is not None:
            old.close()
        self.taken_again += 1
        log.warning("alive mark taken again on a new connection (the server started %.1f s ago)",
                    uptime)  # fmt: skip

    def _give_up(self, why: str) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        log.error(
            "this worker's alive mark was lost with its database connection and %s: another "
            "worker may take this worker's turns over, so it exits now (exit code %d); what "
            "its turns did is kept and continued there. heron serve --workers starts a new "
            "worker; a worker started by hand must be started again (a service manager's "
            "Restart= does it).",
            why,
            EXIT_MARK_LOST,
        )
        self.on_lost()
