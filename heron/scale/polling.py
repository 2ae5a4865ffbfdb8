"""How often the workers look at the queue: every 50 ms while there is work, every 250 ms once
nothing has been sent for a minute.

DBOS has no push for queues: each worker polls, and a poll costs the worker about 5 ms of CPU
(its dequeue statements through SQLAlchemy) whether or not anything waits, about 100 ms a second
at 50 ms. The interval is the queue's row in DBOS's tables, which every worker reads again at
each poll, so a face can change it for all of them: slow when idle, fast again before the next
message is enqueued. What it costs: the first message after an idle minute waits for the
workers' current sleep, 125 ms on average, and DBOS eases its interval back down over the next
two seconds rather than at once (it shrinks a longer interval by a tenth a poll).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from heron.scale.cluster import POLL_S

IDLE_POLL_S = 0.25  # the workers' interval once the face has been idle for IDLE_AFTER_S
IDLE_AFTER_S = 60.0
CHECK_S = 15.0  # how often the face looks whether it has gone idle
log = logging.getLogger(__name__)


class PolledQueue(Protocol):
    """What the governor uses of a DBOS `Queue` (the face's client-bound one)."""

    async def get_polling_interval_sec_async(self) -> float: ...

    async def set_polling_interval_sec_async(self, value: float) -> None: ...


@dataclass
class PollGovernor:
    """The face's say in the workers' polling interval (see the module docstring)."""

    queue: PolledQueue
    fast_s: float = POLL_S
    slow_s: float = IDLE_POLL_S
    idle_after_s: float = IDLE_AFTER_S
    check_s: float = CHECK_S
    clock: Callable[[], float] = time.monotonic
    slow: bool = False  # what this face last set
    _last_work: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self._last_work = self.clock()  # a face just started counts as busy

    async def busy(self) -> None:
        """Work is about to be enqueued: the fast interval first, if this face had slowed it
        (or is slowing it now)."""
        self._last_work = self.clock()
        if not self.slow and not self._lock.locked():
            return
        async with self._lock:
            if self.slow:
                await self.queue.set_polling_interval_sec_async(self.fast_s)
                self.slow = False

    async def run(self, idle: Callable[[], bool]) -> None:
        """Until cancelled: slow the workers once `idle()` has held with nothing sent for
        `idle_after_s`; while idle, set it again when a worker's start reset it."""
        while True:
            await asyncio.sleep(self.check_s)
            if idle() and self.clock() - self._last_work >= self.idle_after_s:
                try:
                    await self._slow_down()
                except Exception:  # the database is out of reach: polls stay as they are
                    log.warning("could not change the workers' polling interval", exc_info=True)

    async def _slow_down(self) -> None:
        async with self._lock:
            if await self.queue.get_polling_interval_sec_async() == self.slow_s:
                self.slow = True
                return
            if self.clock() - self._last_work < self.idle_after_s:
                return  # work came in meanwhile
            await self.queue.set_polling_interval_sec_async(self.slow_s)
            self.slow = True
