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
