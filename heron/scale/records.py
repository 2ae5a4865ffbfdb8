"""The SQL of the workers (kept here by the one-home-for-SQL rule): notifications, the lock a
live worker holds, and which workers own turns in flight.

A worker holds a session-level advisory lock named by its store's schema and its DBOS executor
id for as long as it lives; PostgreSQL drops it when the worker's connection dies, however the
worker died. So a worker that can take another's lock knows that one is dead, and recovers its
turns; and the locks of a schema held now are its live workers (`count_alive`). A server
restart drops every lock at once, of live workers too: heron/scale/alive.py says how they are
taken again before any sweep trusts a free one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

LOCK_SPACE = "heron-worker:"


def notify(conn: psycopg.Connection[Any], channel: str, payload: str) -> None:
    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def notify_async(conn: psycopg.AsyncConnection[Any], channel: str, payload: str) -> None:
    await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def listen(conn: psycopg.AsyncConnection[Any], channel: str) -> None:
    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def _lock_keys(schema: str, executor: str) -> tuple[str, str]:
    """The two keys of a worker's lock: its store's schema (so the workers of one store can be
    counted, `count_alive`) and its executor id."""
    return LOCK_SPACE + schema, executor


def hold_alive(conn: psycopg.Connection[Any], schema: str, executor: str) -> None:
    """This worker is alive for as long as `conn` is open."""
    conn.execute(
        "SELECT pg_advisory_lock(hashtext(%s), hashtext(%s))", _lock_keys(schema, executor)
    )


def ping(conn: psycopg.Connection[Any]) -> None:
    """One round trip: raises when the server dropped `conn` (and with it the lock it held)."""
    conn.execute("SELECT 1")


def server_uptime(conn: psycopg.Connection[Any]) -> float:
    """Seconds since the server started, by its own clock, now (not at the statement's start:
    after a lock waited for, this is read after it was granted)."""
    row = conn.execute(
        "SELECT EXTRACT(EPOCH FROM clock_timestamp() - pg_postmaster_start_time())"
    ).fetchone()
    assert row is not None
    return float(row[0])


def is_dead(conn: psycopg.Connection[Any], schema: str, executor: str) -> bool:
    """Whether no live session holds `executor`'s lock (taken and given back at once)."""
    keys = _lock_keys(schema, executor)
    row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s), hashtext(%s))", keys).fetchone()
    if row is None or not row[0]:
        return False
    conn.execute("SELECT pg_advisory_unlock(hashtext(%s), hashtext(%s))", keys)
    return True


def count_alive(conn: psycopg.Connection[Any], schema: str, excluding: Sequence[str] = ()) -> int:
    """How many workers of the store `schema` are alive, on any host, but those named in
    `excluding` (executor ids): the locks they hold (two int4 keys: the first in `classid`
    and the second in `objid`, each as an unsigned number, and `objsubid` 2)."""
    row = conn.execute(
        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND objsubid = 2 AND classid::bigint = (hashtext(%s)::bigint & 4294967295)"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND objid::bigint <> ALL(SELECT hashtext(e)::bigint & 4294967295"
        " FROM unnest(%s::text[]) AS e)",
        (LOCK_SPACE + schema, list(excluding)),
    ).fetchone()
    return 0 if row is None else int(row[0])


def owners_in_flight(conn: psycopg.Connection[Any], dbos_schema: str, queue: str) -> list[str]:
    """The executors DBOS says run a turn of `queue` now (PENDING: dequeued, not finished)."""
    query = sql.SQL(
        "SELECT DISTINCT executor_id FROM {}.workflow_status"
        " WHERE status = 'PENDING' AND queue_name = %s"
    ).format(sql.Identifier(dbos_schema))
    return [r[0] for r in conn.execute(query, (queue,)).fetchall() if r[0]]


def busy_partitions(
    conn: psycopg.Connection[Any], dbos_schema: str, queue: str, keys: list[str]
) -> set[str]:
    """Which of the conversations `keys` have a turn running or a message queued."""
    query = sql.SQL(
        "SELECT DISTINCT queue_partition_key FROM {}.workflow_status"
        " WHERE status IN ('PENDING', 'ENQUEUED') AND queue_name = %s"
        " AND queue_partition_key = ANY(%s)"
    ).format(sql.Identifier(dbos_schema))
    return {str(r[0]) for r in conn.execute(query, (queue, keys)).fetchall()}


def queued_in(conn: psycopg.Connection[Any], dbos_schema: str, queue: str, key: str) -> int:
    """How many messages of conversation `key` wait in its partition (enqueued, not started)."""
    query = sql.SQL(
        "SELECT COUNT(*) FROM {}.workflow_status WHERE status = 'ENQUEUED'"
        " AND queue_name = %s AND queue_partition_key = %s"
    ).format(sql.Identifier(dbos_schema))
    row = conn.execute(query, (queue, key)).fetchone()
    return 0 if row is None else int(row[0])
