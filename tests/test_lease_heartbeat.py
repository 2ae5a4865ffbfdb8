"""A held lease is renewed while its turn runs (a long turn is never taken over), stops being
renewed once it was lost, and is released when the turn ends, cancelled or not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from heron.agent.leases import hold_lease
from heron.errors import BusyError
from heron.store import Store


def expiry(store: Store, conversation_id: int) -> float | None:
    rows = store.query(
        "SELECT expires FROM turn_leases WHERE conversation_id = ?", (conversation_id,)
    )
    return rows[0][0] if rows else None


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "heron.db")


async def test_a_long_turn_keeps_renewing_its_lease(store):
    cid = store.open_conversation("k").id
    async with hold_lease(store, cid, ttl=0.3):
        first = expiry(store, cid)
        await asyncio.sleep(0.7)  # more than twice the ttl: only renewals keep it ours
        assert expiry(store, cid) > first + 0.3
        with pytest.raises(BusyError):
            async with hold_lease(store, cid, ttl=0.3, timeout=0):
                pass
    assert expiry(store, cid) is None  # released


async def test_a_lost_lease_is_not_renewed_again(store):
    cid = store.open_conversation("k").id
    async with hold_lease(store, cid, ttl=0.3) as lease:
        with store.transaction() as c:  # taken over (as after an expiry)
            c.execute("UPDATE turn_leases SET owner = 'other' WHERE conversation_id = ?", (cid,))
        await asyncio.sleep(0.25)
        assert lease.lost
        taken = expiry(store, cid)
        await asyncio.sleep(0.25)
        assert expiry(store, cid) == taken  # the other owner's row is left alone


async def test_a_cancelled_turn_still_releases(store):
    cid = store.open_conversation("k").id
    held = asyncio.Event()

    async def turn() -> None:
        async with hold_lease(store, cid, ttl=0.3):
            held.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(turn())
    await held.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert expiry(store, cid) is None


async def test_a_look_the_store_cannot_answer_is_made_again_and_fails_no_turn(store, monkeypatch):
    """A database restart during a turn: the epoch look (and the heartbeat) that met it used to
    fail the turn at its end, after its answer was shown. Now the next look is made as usual."""
    from heron.agent import leases
    from heron.errors import StoreUnreachable
    from heron.store import engine_state as es

    cid = store.open_conversation("k").id
    real, looks = es.epoch_and_note, []

    def epoch_and_note(store: Store, conversation_id: int):
        looks.append(conversation_id)
        if len(looks) == 1:
            raise StoreUnreachable("the connection to the PostgreSQL database was lost")
        return real(store, conversation_id)

    monkeypatch.setattr(es, "epoch_and_note", epoch_and_note)
    moved: list[str | None] = []
    epoch = real(store, cid)[0]
    async with leases.watch_epoch(store, cid, epoch, moved.append, every=0.05):
        async with asyncio.timeout(30):  # the looks used to end at the first failure
            while len(looks) < 3:
                await asyncio.sleep(0.01)
    assert moved == []  # the epoch did not move: nothing stopped the turn
