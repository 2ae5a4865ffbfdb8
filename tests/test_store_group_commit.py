"""`Store.write`: while grouping is on, the writes queued in one round of the event loop share
one transaction, and each one still succeeds or fails on its own; the engine turns grouping on
while many turns are in flight."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from heron.messages import user
from heron.store import Store


def _grouping(path) -> Store:
    store = Store(path)
    store.grouping = True
    return store


def _commits(store: Store) -> list[str]:
    """The COMMITs the store's connection runs from now on."""
    seen: list[str] = []
    store.conn.set_trace_callback(lambda sql: seen.append(sql) if sql == "COMMIT" else None)
    return seen


def _texts(path, conversation_id: int) -> list[str]:
    """What another connection sees committed."""
    other = sqlite3.connect(path)
    rows = other.execute(
        "SELECT parts FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
    ).fetchall()
    other.close()
    return [r[0] for r in rows]


async def test_writes_of_one_round_share_one_commit(tmp_path):
    store = _grouping(tmp_path / "h.db")
    ids = [store.open_conversation(f"k{i}").id for i in range(5)]
    commits = _commits(store)
    turns = await asyncio.gather(
        *(store.write(store.begin_turn, cid, f"run{cid}", user(f"hello {cid}")) for cid in ids)
    )
    assert len(commits) == 1
    for cid, (turn_id, stored) in zip(ids, turns, strict=True):
        assert stored.conversation_id == cid and store.turn(f"run{cid}").id == turn_id
        assert len(_texts(tmp_path / "h.db", cid)) == 1  # committed, seen from outside
        assert [m.id for m in store.branch(cid)] == [stored.id]


async def test_a_failing_write_is_rolled_back_alone_and_its_caller_gets_the_error(tmp_path):
    store = _grouping(tmp_path / "h.db")
    a, b, c = (store.open_conversation(k).id for k in "abc")
    hooks: list[str] = []

    def fails_after_writing(conversation_id: int) -> None:
        with store.transaction():
            store.append(conversation_id, user("half of a write"))
            store.after_commit.append(lambda: hooks.append("failed write"))
            raise sqlite3.OperationalError("disk I/O error")

    def writes(conversation_id: int, text: str) -> int:
        with store.transaction():
            store.after_commit.append(lambda: hooks.append(text))
            return store.append(conversation_id, user(text)).id

    results = await asyncio.gather(
        store.write(writes, a, "first"),
        store.write(fails_after_writing, b),
        store.write(writes, c, "third"),
        return_exceptions=True,
    )
    assert isinstance(results[1], sqlite3.OperationalError)
    assert isinstance(results[0], int) and isinstance(results[2], int)
    assert _texts(tmp_path / "h.db", b) == []  # nothing of the failed write
    assert len(_texts(tmp_path / "h.db", a)) == 1 and len(_texts(tmp_path / "h.db", c)) == 1
    assert hooks == ["first", "third"]  # the failed write's commit hook never runs
    assert store.branch(b) == []  # and its row never reached the kept branches


async def test_a_caller_cancelled_before_the_commit_writes_nothing(tmp_path):
    store = _grouping(tmp_path / "h.db")
    a, b = store.open_conversation("a").id, store.open_conversation("b").id
    kept = asyncio.create_task(store.write(store.append, a, user("kept")))
    dropped = asyncio.create_task(store.write(store.append, b, user("dropped")))
    await asyncio.sleep(0)  # both are queued; the round's commit has not run yet
    dropped.cancel()
    await kept
    with pytest.raises(asyncio.CancelledError):
        await dropped
    assert len(_texts(tmp_path / "h.db", a)) == 1
    assert _texts(tmp_path / "h.db", b) == []


async def test_when_the_round_cannot_commit_every_caller_gets_the_error(tmp_path):
    store = _grouping(tmp_path / "h.db")
    a, b = store.open_conversation("a").id, store.open_conversation("b").id
    blocker = sqlite3.connect(tmp_path / "h.db")
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    store.conn.execute("PRAGMA busy_timeout=50")
    results = await asyncio.gather(
        store.write(store.append, a, user("one")),
        store.write(store.append, b, user("two")),
        return_exceptions=True,
    )
    blocker.rollback()
    assert all(isinstance(r, sqlite3.OperationalError) for r in results)
    assert _texts(tmp_path / "h.db", a) == [] and _texts(tmp_path / "h.db", b) == []
    # The store is usable again once the lock is free.
    assert (await store.write(store.append, a, user("again"))).conversation_id == a


async def test_without_grouping_a_write_runs_inline(tmp_path):
    store = Store(tmp_path / "h.db")
    cid = store.open_conversation("k").id
    commits = _commits(store)
    first = store.write(store.append, cid, user("one"))
    second = store.write(store.append, cid, user("two"))
    await first  # committed as soon as it is awaited, without waiting for the other
    assert len(commits) == 1 and len(_texts(tmp_path / "h.db", cid)) == 1
    await second
    assert len(commits) == 2


async def test_the_engine_groups_writes_while_enough_turns_are_in_flight(monkeypatch):
    from heron.agent import engine as engine_module
    from heron.agent.engine import Engine
    from heron.config import Settings
    from heron.messages import Reply, Text, Usage
    from heron.providers.scripted import ScriptedProvider

    monkeypatch.setattr(engine_module, "GROUP_COMMIT_FROM", 3)

    async def answer(request: object) -> Reply:
        await asyncio.sleep(0.01)
        return Reply([Text("ok")], "done", Usage(5, 1))

    async def commits_of(engine: Engine, keys: list[str]) -> int:
        seen = _commits(engine.store)
        await asyncio.gather(*(engine.turn(k, "hello") for k in keys))
        engine.store.conn.set_trace_callback(None)
        return len(seen)

    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        await commits_of(engine, ["a", "b", "c", "d"])  # first turns: conversations opened
        apart = await commits_of(engine, ["a", "b"])  # below the threshold: inline
        together = await commits_of(engine, ["a", "b", "c", "d"])
        assert not engine.store.grouping  # off again once the turns are done
        rows = {k: len(engine.store.branch(engine.store.conversation(k).id)) for k in "abcd"}
    assert apart == 2 * 3  # each turn's lease claim, user message and SAVE commit alone
    # The first two start below the threshold and commit alone; from the third on, the
    # writes of the turns in step share commits.
    assert together < 4 * 3
    assert rows == {"a": 6, "b": 6, "c": 4, "d": 4}  # and nothing was lost


async def test_a_lone_write_runs_in_its_own_transaction(tmp_path):
    store = _grouping(tmp_path / "h.db")
    cid = store.open_conversation("k").id
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    await store.write(store.append, cid, user("alone"))
    assert not any(s.startswith("SAVEPOINT") for s in statements)
    assert statements.count("COMMIT") == 1


# ---- the window a queued write opens: cancelled just before or just after its commit ---------


def _cancel_after_commit(monkeypatch: pytest.MonkeyPatch, victim: list[asyncio.Task]) -> None:
    """The round commits, then the waiting task is cancelled before it resumes."""
    real = Store._commit_queued

    def commit_then_cancel(self: Store) -> None:
        real(self)
        victim[0].cancel()

    monkeypatch.setattr(Store, "_commit_queued", commit_then_cancel)


async def test_a_lease_claim_cancelled_after_its_commit_is_given_back(tmp_path, monkeypatch):
    from heron.agent.leases import hold_lease
    from heron.store import engine_state as es

    store = _grouping(tmp_path / "h.db")
    cid = store.open_conversation("k").id

    async def hold() -> None:
        async with hold_lease(store, cid):
            await asyncio.sleep(10)

    victim: list[asyncio.Task] = []
    _cancel_after_commit(monkeypatch, victim)
    victim.append(asyncio.create_task(hold()))
    with pytest.raises(asyncio.CancelledError):
        await victim[0]
    assert es.lease_holder(store, cid) is None  # not held until it expires


async def test_a_turn_cancelled_while_its_save_waits_keeps_its_trace_rows(monkeypatch):
    """A hard break that lands while SAVE is queued: SAVE never runs, and the interrupted path
    writes the run's trace rows (not its reply) and the minimal stopped record."""
    from heron.agent.engine import Engine
    from heron.agent.turn import STOPPED
    from heron.config import Settings
    from heron.messages import Reply, Text, Usage
    from heron.providers.scripted import ScriptedProvider
    from heron.store import engine_state as es

    monkeypatch.setattr("heron.agent.engine.GROUP_COMMIT_FROM", 1)  # a lone turn groups
    provider = ScriptedProvider([Reply([Text("the answer")], "done", Usage(5, 1))])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        task: list[asyncio.Task] = []
        real = Store.write

        async def write(self: Store, fn, *args, **kwargs):
            if fn is es.settle_turn:
                asyncio.get_running_loop().call_soon(task[0].cancel)  # before the round
            return await real(self, fn, *args, **kwargs)

        monkeypatch.setattr(Store, "write", write)
        task.append(asyncio.create_task(engine.turn("k", "hello")))
        with pytest.raises(asyncio.CancelledError):
            await task[0]
        conv = engine.store.conversation("k")
        turn = engine.store.turns(conv.id)[-1]
        texts = [m.message.text for m in engine.store.branch(conv.id)]
        calls = engine.store.query("SELECT COUNT(*) FROM model_calls")[0][0]
        holder = es.lease_holder(engine.store, conv.id)
    assert calls == 1  # the call made is in the trace
    assert texts == ["hello", STOPPED] and turn.status == "interrupted"
    assert holder is None
