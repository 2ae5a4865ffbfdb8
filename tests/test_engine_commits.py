"""A turn's last writes share one commit: SAVE writes the turn row, checks the epoch and the
lease, and gives the lease back in a single transaction; a stale turn keeps its lease until it
ends and is marked interrupted."""

from __future__ import annotations

import asyncio

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
    last = transactions(seen)[-1]
    assert last[0].startswith("UPDATE turns SET status")  # the turn row ...
    assert any("JOIN turn_leases" in s and s.startswith("SELECT") for s in last)  # ... check
    assert last[-1].startswith("DELETE FROM turn_leases")  # ... and release, one commit
    assert sum(s.startswith("DELETE FROM turn_leases") for s in seen) == 1


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
    assert gate.is_set()
    assert result.outcome.value == "stale" and result.reply is None
    assert (turn.status, turn.stop_reason) == ("interrupted", "stale")
    assert holder is None  # released when the turn ended
