"""The store's TraceCache: a steady-state turn looks up only what it adds, and what it knows is
never wrong: not after another connection (or this one) collected garbage and reused ids, nor
after a trace write rolled back."""

from __future__ import annotations

import sqlite3

import pytest
from store_faults import fail_first_tool_call_append

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage, dumps
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.trace.blobs import collect_garbage, put_blob, put_chain
from heron.trace.read import list_runs, load_run, request_payload

PREVIOUS_CHAIN = ("request_ref FROM model_calls", "FROM trace_runs r", "WITH RECURSIVE path")


def _ok(request: object) -> Reply:
    return Reply([Text("ok")], "done", Usage(50, 2))


def _recorded(store: Store, *keys: str) -> list[str]:
    """Every recorded request of the conversations, rebuilt, in the order they were made; every
    node's parent on disk first (a node chained to a rolled-back or collected id is not)."""
    orphans = store.query(
        "SELECT COUNT(*) FROM trace_nodes n WHERE n.parent_id != 0 AND (n.parent_id >= n.id"
        " OR NOT EXISTS (SELECT 1 FROM trace_nodes p WHERE p.id = n.parent_id))"
    )
    assert orphans[0][0] == 0
    runs = [run for key in keys for run in list_runs(store, key)]
    calls = [c for run in runs for c in load_run(store, run.run_id).calls]
    return [request_payload(store, c) for c in sorted(calls, key=lambda c: c.started)]


def _sent(provider: ScriptedProvider) -> list[str]:
    return [dumps(provider.payload(r)) for r in provider.requests]


async def _traced(engine: Engine, key: str, text: str) -> list[str]:
    """The trace's statements of one turn."""
    seen: list[str] = []
    engine.store.conn.set_trace_callback(seen.append)
    try:
        await engine.turn(key, text)
    finally:
        engine.store.conn.set_trace_callback(None)
    return [s for s in seen if "trace_" in s or "model_calls" in s or "FROM turns WHERE" in s]


async def test_a_steady_state_turn_looks_up_only_the_last_reply_and_the_new_message():
    provider = ScriptedProvider(_ok)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        first = await _traced(engine, "s", "hello")
        second = await _traced(engine, "s", "and again")
        third = await _traced(engine, "s", "once more")
        recorded = _recorded(engine.store, "s")
    assert recorded == _sent(provider)
    for steady in (second, third):
        assert len(steady) < len(first)
        assert not [s for s in steady if any(q in s for q in PREVIOUS_CHAIN)]
        # Two messages are new (the last reply, the new user message); the system prompt, the
        # tools and the prompt inputs are known by body, the first request by the start's chain.
        assert sum("SELECT id FROM trace_blobs" in s for s in steady) == 2
    # A node is looked up only for a blob that was there already: the second turn's last reply
    # ("ok") is a new blob (no node names it yet), the third's is the same body again, under a
    # new parent; the user's message after it follows a node just inserted.
    assert sum("SELECT id FROM trace_nodes" in s for s in second) == 0
    assert sum("SELECT id FROM trace_nodes" in s for s in third) == 1


def _gc_elsewhere(store: Store, conversation_id: int) -> None:
    """Delete a conversation, collect its trace, and take the freed ids for other rows."""
    store.delete_conversation(conversation_id)
    with store.transaction() as conn:
        assert collect_garbage(conn) > 0
        ids = [put_blob(conn, "raw", f"unrelated {i}") for i in range(8)]
        put_chain(conn, [dumps({"role": "user", "n": i}) for i in range(8)])
    if store.backend == "sqlite":  # PostgreSQL never takes an id again: nothing to reuse
        freed = conn.execute("SELECT COUNT(*) FROM trace_nodes WHERE id <= 3").fetchone()[0]
        assert min(ids) <= 3 and freed  # the deleted rows' ids now hold other rows


@pytest.mark.parametrize("where", ["another connection", "the same store"])
async def test_ids_reused_after_garbage_collection_are_never_taken_from_the_cache(where, home_db):
    """On both backends: on SQLite the freed ids are taken again; on PostgreSQL they are not,
    but the collection (by this store or another worker's) still voids what the cache knew."""
    settings = Settings.load()
    provider = ScriptedProvider(_ok)
    async with Engine.open(settings, provider=provider) as engine:
        await engine.turn("gone", "hello")  # the cache now knows its chain and blobs
        await engine.turn("gone", "and again")
        gone = engine.store.conversation("gone")
        assert gone is not None
        other = Store(settings.database) if where == "another connection" else engine.store
        _gc_elsewhere(other, gone.id)
        if other is not engine.store:
            other.close()
        del provider.requests[:]
        await engine.turn("gone", "hello")  # the same first message, maybe the same id
        await engine.turn("gone", "and again")
        recorded = _recorded(engine.store, "gone")
    assert len(recorded) == 2
    assert recorded == _sent(provider)


async def test_a_rolled_back_trace_write_leaves_nothing_in_the_cache(monkeypatch):
    """The reply's transaction (which writes the start and the model call's row) fails: the
    nodes and blobs it inserted are rolled back and their ids taken again by the next inserts;
    the next turns' requests still rebuild exactly."""
    script = [
        Reply([Text("Hi.")], "done", Usage(90, 2)),
        Reply([ToolCall("c1", "run_cell", {"code": "print(6 * 7)"})], "tool", Usage(100, 10)),
        Reply([Text("It is 42.")], "done", Usage(130, 5)),
        Reply([Text("Still 42.")], "done", Usage(150, 5)),
        Reply([Text("Yes.")], "done", Usage(160, 5)),
    ]
    provider = ScriptedProvider(script)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        store = engine.store
        await engine.turn("r", "warm up")  # the cache knows the conversation's chain
        fault = fail_first_tool_call_append(monkeypatch)
        with pytest.raises(sqlite3.OperationalError):
            await engine.turn("r", "what is 6 * 7? use python")
        fault.restore()
        # Rows of another conversation take the ids the rollback freed.
        await engine.turn("other", "a different first message")
        await engine.turn("r", "and now?")
        await engine.turn("r", "sure?")
        recorded = _recorded(store, "r", "other")
    assert fault.failed
    assert recorded == _sent(provider)


def test_the_cache_slot_is_dropped_when_the_database_file_is_replaced(tmp_path):
    from heron.trace.blobs import TraceCache
    from heron.trace.recorder import trace_cache

    path = tmp_path / "h.db"
    store = Store(path)
    try:
        first = trace_cache(store)
        assert isinstance(first, TraceCache) and trace_cache(store) is first  # one per connection
        Store(tmp_path / "other.db").close()
        (tmp_path / "other.db").replace(path)  # another file takes the database's place
        assert store.check_file() is not None
        assert store.trace_cache is None
        assert trace_cache(store) is not first
    finally:
        store.close()


@pytest.mark.pg
def test_a_trace_write_reads_the_collection_counter_only_once_it_holds_the_lock(pg_url):
    """On PostgreSQL a trace write takes the collection's advisory lock (shared) and reads its
    counter in one statement. A write that waited for a collection must read the counter the
    collection moved, or it would keep ids the collection deleted."""
    import threading

    import psycopg

    from heron.trace import records

    store = Store(pg_url)
    collector = psycopg.connect(pg_url, autocommit=True)
    try:
        before = [records.data_version(store.conn)]
        collector.execute("BEGIN")
        collector.execute("SELECT pg_advisory_xact_lock(1752, hashtext(current_schema()))")
        seen: list[int] = []

        def write() -> None:
            with store.transaction() as conn:
                seen.append(records.data_version(conn))

        writer = threading.Thread(target=write)
        writer.start()
        while not collector.execute(  # the writer waits for the lock
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()[0]:
            writer.join(0.01)
        collector.execute("SELECT nextval('heron_trace_gc')")
        collector.execute("COMMIT")
        writer.join()
    finally:
        collector.close()
        store.close()
    assert seen == [before[0] + 1]
