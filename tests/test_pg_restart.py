"""A PostgreSQL restart (an upgrade, a reboot) under a running store: its connection is made
again at the next statement, a transaction it cut off fails saying nothing of it was saved,
and while the server is down statements fail at once, saying so (heron/store/pg.py)."""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg
import pytest

from heron.errors import StoreUnreachable
from heron.messages import Message, Text
from heron.store import pg
from heron.store.db import Store
from heron.store.pg import PgConnection, pg_of

pytestmark = pytest.mark.pg


@pytest.fixture
def url(own_pg_server) -> str:
    schema = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(own_pg_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{own_pg_server.url}?options=-csearch_path%3D{schema}"


def _pg(store: Store) -> PgConnection:
    found = pg_of(store.conn)
    assert found is not None
    return found


def _texts(store: Store, key: str) -> list[str]:
    conv = store.conversation(key)
    assert conv is not None
    return [m.message.parts[0].text for m in store.branch(conv.id)]


def test_a_write_after_a_restart_is_stored_on_a_new_connection(own_pg_server, url):
    store = Store(url)
    conv = store.open_conversation("k")
    store.append(conv.id, Message("user", [Text("before")]))
    own_pg_server.restart()
    # The first statement after the restart finds the connection lost: the transaction it
    # opened had sent nothing that could commit, so it is sent again on a new connection.
    store.append(conv.id, Message("user", [Text("after")]))
    assert _pg(store).reconnects == 1
    assert _texts(Store(url), "k") == ["before", "after"]


def test_a_read_after_a_restart_is_answered(own_pg_server, url):
    store = Store(url)
    store.open_conversation("k")
    own_pg_server.restart()
    assert store.conversation("k") is not None
    assert _pg(store).reconnects == 1


def test_a_transaction_cut_off_by_a_restart_fails_and_keeps_nothing(own_pg_server, url):
    store = Store(url)
    conv = store.open_conversation("k")
    expected = pytest.raises(StoreUnreachable, match="nothing of it was saved")
    with expected as cut, store.transaction() as conn:
        conn.execute("UPDATE conversations SET title = ? WHERE id = ?", ("half", conv.id))
        own_pg_server.restart()
        conn.execute("UPDATE conversations SET title = ? WHERE id = ?", ("done", conv.id))
    assert "connects again" in str(cut.value)  # the hint: what happens next
    assert store.conversation("k").title is None  # the server rolled it back
    store.set_title(conv.id, "next")  # the next transaction runs on a new connection
    assert Store(url).conversation("k").title == "next"


def test_while_the_server_is_down_statements_fail_at_once_then_work_again(
    own_pg_server, url, monkeypatch
):
    store = Store(url)
    conv = store.open_conversation("k")
    monkeypatch.setattr(pg, "FIRST_WAIT_S", 60.0)  # no second try while the test looks
    own_pg_server.pg_ctl("-m", "fast", "stop")
    try:
        with pytest.raises(StoreUnreachable, match="cannot connect again"):
            store.append(conv.id, Message("user", [Text("lost?")]))
        tries = []
        real_open = PgConnection._open
        monkeypatch.setattr(PgConnection, "_open", lambda self, t: tries.append(t))
        with pytest.raises(StoreUnreachable, match="connecting again in"):
            store.conversation("k")
        assert tries == []  # within the back-off: no connection tried, no wait
        monkeypatch.setattr(PgConnection, "_open", real_open)
    finally:
        own_pg_server.start_again()
    _pg(store)._next_try = time.monotonic()  # the back-off over
    store.append(conv.id, Message("user", [Text("back")]))
    assert _texts(store, "k") == ["back"]


async def test_a_note_sent_after_a_restart_goes_out_on_a_new_connection(own_pg_server, url):
    """A worker's first note after the restart (a turn's `started`) used to fail its workflow."""
    from heron.scale.cluster import cluster_of
    from heron.scale.notes import Listener, Publisher, start_listener, stop_task

    cluster = cluster_of(url)
    publisher = Publisher(cluster)
    await publisher.send({"t": "before"})
    own_pg_server.restart()
    heard: list[dict] = []
    listening = await start_listener(Listener(cluster, heard.append))
    try:
        await publisher.send({"t": "after"})
        for _ in range(500):
            if heard:
                break
            await asyncio.sleep(0.01)
    finally:
        await stop_task(listening)
        await publisher.close()
    assert heard == [{"t": "after"}]


def _until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def mark_lost() -> list[str]:
    """The worker's exit, recorded instead of made (`AliveMark.on_lost`)."""
    return []


def _mark(url: str, executor: str, lost: list[str]):
    from heron.scale.alive import AliveMark
    from heron.scale.cluster import cluster_of

    cluster = cluster_of(url)
    mark = AliveMark(cluster.url, cluster.schema, executor, on_lost=lambda: lost.append("exit"))
    mark.take()
    return mark


def _alive(url: str) -> int:
    from heron.scale import records
    from heron.scale.cluster import cluster_of

    with psycopg.connect(url, autocommit=True) as conn:
        return records.count_alive(conn, cluster_of(url).schema)


def test_a_workers_alive_mark_is_taken_again_after_a_restart(own_pg_server, url, mark_lost):
    mark = _mark(url, "w1", mark_lost)
    try:
        own_pg_server.restart()
        _until(lambda: mark.taken_again == 1)
        assert _alive(url) == 1  # held again: no sweep takes this worker for dead
        assert mark_lost == []
    finally:
        mark.close()
    _until(lambda: _alive(url) == 0)  # the server ends the session a moment after the close


def test_a_sweep_takes_no_live_worker_for_dead_after_a_restart(
    own_pg_server, url, mark_lost, monkeypatch
):
    """The sweep used to find every mark free right after a restart, and hand the turns of
    live workers to the queue: two workers on one turn."""
    from heron.scale import alive, worker
    from heron.scale.cluster import QUEUE, cluster_of

    cluster = cluster_of(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {cluster.dbos_schema}")
        conn.execute(
            f"CREATE TABLE {cluster.dbos_schema}.workflow_status"
            " (executor_id text, status text, queue_name text)"
        )
        conn.execute(
            f"INSERT INTO {cluster.dbos_schema}.workflow_status VALUES ('w1', 'PENDING', %s)",
            (QUEUE,),
        )
    mark = _mark(url, "w1", mark_lost)
    try:
        own_pg_server.restart()
        with psycopg.connect(url, autocommit=True) as sweep:
            # Before w1 takes its mark again: the server is new, no free mark is trusted.
            assert worker._dead_owners(sweep, cluster, "w2") == []
            _until(lambda: mark.taken_again == 1)
            monkeypatch.setattr(alive, "RESTART_GRACE_S", 0.0)  # as if long after the start
            assert worker._dead_owners(sweep, cluster, "w2") == []  # held again
            mark.close()
            _until(lambda: worker._dead_owners(sweep, cluster, "w2") == ["w1"])  # now dead
    finally:
        mark.close()
    assert mark_lost == []


def test_a_worker_that_cannot_take_its_mark_again_in_time_exits(
    own_pg_server, url, mark_lost, monkeypatch
):
    from heron.scale import alive

    monkeypatch.setattr(alive, "LOST_S", 0.5)
    mark = _mark(url, "w1", mark_lost)
    own_pg_server.pg_ctl("-m", "fast", "stop")
    try:
        _until(lambda: mark_lost == ["exit"])
    finally:
        mark.close()
        own_pg_server.start_again()
    assert mark.taken_again == 0


def test_a_worker_whose_mark_comes_back_after_a_sweep_may_trust_it_exits(
    own_pg_server, url, mark_lost, monkeypatch
):
    """Its connection alone cut while the server stays up: another worker's sweep may have
    taken its turns already, so it does not go on beside that one."""
    from heron.scale import alive

    monkeypatch.setattr(alive, "RESTART_GRACE_S", 0.0)
    mark = _mark(url, "w1", mark_lost)
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            pid = mark.conn.info.backend_pid
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        _until(lambda: mark_lost == ["exit"])
        assert mark.taken_again == 0
    finally:
        mark.close()


async def test_a_listener_listens_again_after_a_restart(own_pg_server, url):
    """A worker's listener (/stop, mail) used to end with its connection, for good."""
    from heron.scale.cluster import cluster_of
    from heron.scale.notes import Listener, Publisher, keep_listening, stop_task

    cluster = cluster_of(url)
    heard: list[dict] = []
    listening = await keep_listening(Listener(cluster, heard.append))
    publisher = Publisher(cluster)
    try:
        own_pg_server.restart()
        # Notes sent before it listens again are not heard (notes are not durable): sent
        # until one is.
        for _ in range(600):
            await publisher.send({"t": "after"})
            await asyncio.sleep(0.05)
            if heard:
                break
    finally:
        await stop_task(listening)
        await publisher.close()
    assert heard[:1] == [{"t": "after"}]


def _work_then_slow_answer(held: dict[str, float]):
    """A bash tool call that appends to ran.txt, then the answer, held the first time."""
    from heron.testing.script import ServerReply

    def script(body: dict) -> ServerReply:
        if body["messages"][-1]["role"] != "tool":
            return ServerReply(tool_calls=[("bash", {"command": "echo ran >> ran.txt"})])
        return ServerReply(text="finished k1", delay_s=held.pop("k1", 0.0))

    return script


@pytest.mark.slow
async def test_a_turn_running_through_a_restart_is_run_by_its_worker_alone(
    own_pg_server, url, heron_home, monkeypatch
):
    """Two workers; the database restarts while one waits for the model. The other's sweep
    used to take it for dead (its mark gone with the restart) and run the turn again."""
    from pg import raw_count
    from scale_helpers import on_workers

    async with on_workers(_work_then_slow_answer({"k1": 12.0}), heron_home, url, monkeypatch) as (
        server,
        workers,
        f,
    ):
        f.send("k1", "work on k1")
        await f.wait_for(lambda: len(server.requests) >= 2)  # the tool ran; the answer held
        own_pg_server.restart()
        answers = "SELECT COUNT(*) FROM messages WHERE parts LIKE ?"
        for _ in range(1200):
            if raw_count(url, answers, ("%finished k1%",)):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(3)  # a wrong recovery would have shown by now
        assert len(server.requests) == 2, "another worker asked the model again"
        assert raw_count(url, answers, ("%finished k1%",)) == 1
        assert _alive(url) == 2  # both workers took their marks again
        ran = (heron_home / "workspace" / "ran.txt").read_text().splitlines()
        assert ran == ["ran"]
        assert all(p.poll() is None for p in workers.procs)
    # on leaving, each worker is stopped with SIGTERM and must exit 0
