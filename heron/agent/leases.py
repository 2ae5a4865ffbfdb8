"""Cross-process exclusion: one running turn per conversation, and presence of open chats.

A lease is a row in the store (owner, host, pid, expiry) claimed inside a write transaction,
renewed by a heartbeat while the turn runs and deleted when it ends. A second claimant waits,
polling with backoff, and tells its user once that the conversation is "busy in another
session". A crashed holder's claim is void when it expires, or at once when the holder was a
process on this host that no longer exists (kill -9 leaves no one to release it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from heron.errors import BusyError, StoreRefused, StoreUnreachable
from heron.store import Store
from heron.store import engine_state as es

LEASE_TTL = 30.0  # seconds a claim lives without a heartbeat
PRESENCE_TTL = 60.0
# Seconds between a running turn's reads of its stored epoch: how soon it notices a /stop or
# /new sent from another process (one indexed read of one row; a turn shorter than this never
# reads it).
EPOCH_POLL = 1.0
log = logging.getLogger(__name__)


def new_owner() -> str:
    # Unique within the process without reading the entropy pool (slow on some VMs, and this
    # runs once per turn): a monotonic clock reading plus the running task's identity.
    return f"{es.HOST}:{os.getpid()}:{time.monotonic_ns():x}.{id(asyncio.current_task()):x}"


def busy_message(holder: es.Holder) -> str:
    return f"busy in another session ({holder.describe()}); waiting for it to finish…"


def left_message(holder: es.Holder) -> str:
    """What a turn says when it took the lease from a holder that is gone: the turn that holder
    ran ended unfinished, and this one goes on from what it saved (RESTORE closes the rest)."""
    why = "its process has ended" if holder.host == es.HOST else "its claim expired"
    return f"{holder.describe()} ended without finishing ({why}); what it saved is kept"


class Lease:
    """A held turn lease; `check()` is the commit-time ownership test."""

    def __init__(
        self, store: Store, conversation_id: int, owner: str, ttl: float, claim: es.Claim
    ) -> None:
        self.store = store
        self.epoch = claim.epoch  # the conversation's epoch when the lease was won
        self.dirty = claim.dirty  # an earlier turn left work to recover
        self.left_by = claim.left_by  # the holder whose claim it took, gone without a release
        self.conversation_id = conversation_id
        self.owner = owner
        self.ttl = ttl
        self.lost = False
        self.released = False  # given back already (with the turn's last writes, SAVE)

    async def check(self) -> bool:
        ok = await self.store.call(
            es.renew_lease, self.store, self.conversation_id, self.owner, self.ttl
        )
        self.lost = self.lost or not ok
        return ok

    async def beat(self) -> bool:
        """Renew the claim; whether to go on beating (not once it was lost)."""
        await self.check()
        return not self.lost


@asynccontextmanager
async def hold_lease(
    store: Store,
    conversation_id: int,
    *,
    on_busy: Callable[[str], None] | None = None,
    ttl: float = LEASE_TTL,
    timeout: float | None = None,
) -> AsyncIterator[Lease]:
    """Wait for and hold the conversation's turn lease; heartbeat while held, release after."""
    owner = new_owner()
    mine = _HELD.setdefault(store, set())
    mine.add(owner)  # before the claim: a serve never takes its own turn for another's
    try:
        claim = await _acquire(store, conversation_id, owner, ttl, on_busy, timeout)
        _CLAIMED.setdefault(store, {})[conversation_id] = time.time()
        lease = Lease(store, conversation_id, owner, ttl, claim)

        async def release() -> None:
            if lease.released:
                return
            # A disk that refuses writes keeps the claim on record: the next claim finds this
            # process gone (or the claim expired) and takes it over, saying so.
            with contextlib.suppress(StoreRefused):
                await store.call(es.release_lease, store, conversation_id, owner)

        async with _beating(lease.beat, ttl / 3, release):
            yield lease
    finally:
        mine.discard(owner)


# The owners of the leases claimed (or being claimed) through each open Store: a serve tells
# its own turns from other processes' by them (heron/serve/elsewhere.py). By Store, not by pid,
# so that a second Engine in one process (a test) counts as another process.
_HELD: weakref.WeakKeyDictionary[Store, set[str]] = weakref.WeakKeyDictionary()
# When a lease was last won through each Store, by conversation id: the turns started after
# it there are this process's (a serve's own, which another's turn that ended before is not).
_CLAIMED: weakref.WeakKeyDictionary[Store, dict[int, float]] = weakref.WeakKeyDictionary()


def held_here(store: Store) -> frozenset[str]:
    """The owners of the turn leases held, or waited for, through `store` now."""
    return frozenset(_HELD.get(store, ()))


def claimed_here(store: Store, conversation_id: int) -> float | None:
    """When a turn lease of the conversation was last won through `store` (None: never)."""
    return _CLAIMED.get(store, {}).get(conversation_id)


@asynccontextmanager
async def _beating(
    beat: Callable[[], Awaitable[bool]], every: float, release: Callable[[], Awaitable[Any]]
) -> AsyncIterator[None]:
    """Call `beat` every `every` seconds while the block runs, until it returns False; then
    `release`, shielded: a cancelled turn must still give the conversation back. A timer, not
    a task asleep in a loop: most turns end before the first beat (docs/performance.md)."""
    loop = asyncio.get_running_loop()
    running: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None

    def fire() -> None:
        nonlocal running
        running = loop.create_task(beat_once())

    async def beat_once() -> None:
        nonlocal timer
        try:
            again = await beat()
        except StoreUnreachable as error:
            # The database restarted (or is out of reach): this beat is skipped, the next one
            # connects again. A look or renewal is no reason to fail the turn, which used to
            # fail at its end, its answer shown; its commit checks the lease all the same.
            log.info("a turn's lease or epoch look failed; looking again in %.1f s: %s",
                     every, error)  # fmt: skip
            again = True
        if again:
            timer = loop.call_later(every, fire)

    timer = loop.call_later(every, fire)
    try:
        yield
    finally:
        timer.cancel()
        if running is not None:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        await asyncio.shield(release())


@asynccontextmanager
async def watch_epoch(
    store: Store,
    conversation_id: int,
    epoch: int,
    on_moved: Callable[[str | None], None],
    every: float | None = None,
) -> AsyncIterator[None]:
    """While the block runs, read the conversation's stored epoch every `every` seconds
    (`EPOCH_POLL`); once it is no longer `epoch` (another process's /stop or /new bumped it),
    call `on_moved` with what that bump said stopped the turn (None: it said nothing) and read
    no more. A timer, like the heartbeat: across processes SQLite offers no signal but a read."""

    async def look() -> bool:
        now, by = await store.call(es.epoch_and_note, store, conversation_id)
        if now == epoch:
            return True
        on_moved(by)
        return False

    async with _beating(look, EPOCH_POLL if every is None else every, _nothing):
        yield


async def _nothing() -> None:
    return None


async def _acquire(
    store: Store,
    conversation_id: int,
    owner: str,
    ttl: float,
    on_busy: Callable[[str], None] | None,
    timeout: float | None,
) -> es.Claim:
    delay, waited, told = 0.02, 0.0, False
    while True:
        claim = await store.call(es.try_lease, store, conversation_id, owner, ttl)
        holder = claim.holder
        if holder is None:
            return claim
        if not told and on_busy is not None:
            on_busy(busy_message(holder))
            told = True
        if timeout is not None and waited >= timeout:
            raise BusyError(
                f"the conversation is busy: {holder.describe()}",
                hint="Wait for that turn to finish, or stop it with /stop in that session.",
            )
        # Polling is the only signal SQLite offers across processes; back off to stay cheap.
        await asyncio.sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.5)


@asynccontextmanager
async def presence(
    store: Store, conversation_id: int, what: str = "an open chat", ttl: float = PRESENCE_TTL
) -> AsyncIterator[str]:
    """Mark the conversation as in use (an open chat) for as long as the block runs."""
    owner = new_owner()
    await store.call(es.enter, store, conversation_id, owner, what, ttl)

    async def beat() -> bool:
        await store.call(es.enter, store, conversation_id, owner, what, ttl)
        return True

    leave = lambda: store.call(es.leave, store, conversation_id, owner)  # noqa: E731
    async with _beating(beat, ttl / 3, leave):
        yield owner
