"""A turn's last writes share one commit: SAVE checks the epoch and the lease, then writes the
final reply (held since the model answered), its model call's trace row and the turn row, and
gives the lease back, in a single transaction; a stale turn writes no reply and is marked
interrupted."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.store import engine_state as es


def transactions(statements: list[str]) -> list[list[str]]:
    """The statements between each BEGIN and its COMMIT."""
    out: list[list[str]] = []
    for sql in statements:
        if sql.startswith("BEGIN"):
            out.append([])
        elif sql.startswith(("COMMIT", "ROLLBACK")):
            continue
        elif out:
            out[-1].append(sql)
    return out


async def test_save_finishes_the_turn_and_releases_the_lease_in_one_commit():
    provider = ScriptedProvider([Reply([Text("one")], "done", Usage(5, 1))] * 2)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("k", "first")
        seen: list[str] = []
        engine.store.conn.set_trace_callback(seen.append)
        result = await engine.turn("k", "second")
        engine.store.conn.set_trace_callback(None)
        conv = engine.store.conversation("k")
        turn = engine.store.turns(conv.id)[-1]
        holder = es.lease_holder(engine.store, conv.id)
    assert result.text == "one" and turn.status == "done" and holder is None
    # Three commits a turn: the lease, the user's message with its turn row, and SAVE.
    assert sum(sql.startswith("BEGIN") for sql in seen) == 3
    last = [sql for sql in transactions(seen)[-1] if not sql.startswith("--")]
    assert "JOIN turn_leases" in last[0]  # the commit-time check first, then ...
    assert any(sql.startswith("INSERT INTO model_calls") for sql in last)  # the call's row,
    replies = [sql for sql in last if sql.startswith("INSERT INTO messages")]
    assert replies and "'assistant'" in replies[0]  # the reply held for SAVE,
    assert any(sql.startswith("UPDATE turns SET status = 'done'") for sql in last)  # the row
    assert last[-1].startswith("DELETE FROM turn_leases")  # and the release, in one commit
    assert sum(sql.startswith("DELETE FROM turn_leases") for sql in seen) == 1


async def test_a_turn_made_stale_before_save_keeps_nothing_of_the_lease_and_is_interrupted():
    gate = asyncio.Event()
    engine_ref: list[Engine] = []

    async def answer(request: object) -> Reply:
        engine = engine_ref[0]
        conv = engine.store.conversation("k")
        es.bump_epoch(engine.store, conv.id)  # /new from another process, mid-call
        gate.set()
        return Reply([Text("late")], "done", Usage(5, 1))

    async with Engine.open(Settings.load(), provider=ScriptedProvider(answer)) as engine:
        engine_ref.append(engine)
        result = await engine.turn("k", "hello")
        conv = engine.store.conversation("k")
        turn = engine.store.turns(conv.id)[-1]
        holder = es.lease_holder(engine.store, conv.id)
        texts = [m.message.text for m in engine.store.all_messages(conv.id)]
        calls = engine.store.query("SELECT COUNT(*) FROM model_calls")[0][0]
    assert gate.is_set()
    assert "late" not in texts  # the held reply of a stale turn is never written
    assert calls == 1  # but the call it made stays in the trace
    assert result.outcome.value == "stale" and result.reply is None
    assert (turn.status, turn.stop_reason) == ("interrupted", "stale")
    assert holder is None  # released when the turn ended


async def test_a_failed_save_keeps_the_call_in_the_trace_and_the_record_whole(monkeypatch):
    """SAVE's transaction fails (the disk, say) while writing the held reply: the turn ends in
    the error, the record gets the minimal stopped reply, and the model call stays traced."""
    from heron.agent.turn import STOPPED
    from heron.store import Store

    real = Store.append

    def append(self, conversation_id, message, **kw):
        if message.role == "assistant" and message.text == "lost":
            raise sqlite3.OperationalError("disk I/O error")
        return real(self, conversation_id, message, **kw)

    provider = ScriptedProvider([Reply([Text("lost")], "done", Usage(5, 1))])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        monkeypatch.setattr(Store, "append", append)
        with pytest.raises(sqlite3.OperationalError):
            await engine.turn("k", "hello")
        monkeypatch.setattr(Store, "append", real)
        conv = engine.store.conversation("k")
        texts = [m.message.text for m in engine.store.all_messages(conv.id)]
        turn = engine.store.turns(conv.id)[-1]
        calls = engine.store.query("SELECT COUNT(*) FROM model_calls")[0][0]
        holder = es.lease_holder(engine.store, conv.id)
    assert texts == ["hello", STOPPED] and turn.status == "interrupted"
    assert calls == 1 and holder is None
