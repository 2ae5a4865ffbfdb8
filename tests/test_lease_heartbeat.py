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
