"""The clock proactive work runs on: wall time to decide what is due, and a wait until then.

The scheduler and the heartbeat never read `time.time()` or sleep themselves; they ask a
`Clock`. `SystemClock` is the real one. `FakeClock` is moved by hand (tests, benchmarks of the
decision path): a wait ends when the clock is advanced past its deadline or the waiter is woken,
and `idle()` returns once every task waiting on it is waiting again, so a test awaits events,
never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Epoch seconds."""
        ...

    async def sleep_until(self, deadline: float, wake: asyncio.Event | None = None) -> None:
        """Return at `deadline`, or earlier once `wake` is set."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    async def sleep_until(self, deadline: float, wake: asyncio.Event | None = None) -> None:
        delay = max(0.0, deadline - time.time())
        if wake is None:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), delay)


class FakeClock:
    """A clock that moves only when told; for tests."""

    def __init__(self, start: float) -> None:
        self.t = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._changed = asyncio.Event()

    def now(self) -> float:
        return self.t

    @property
    def waiting(self) -> int:
        return len(self._sleepers)

    async def sleep_until(self, deadline: float, wake: asyncio.Event | None = None) -> None:
        if deadline <= self.t or (wake is not None and wake.is_set()):
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (deadline, future)
        self._sleepers.append(entry)
        self._changed.set()
        waits: list[asyncio.Future[Any]] = [future]
        woken = asyncio.ensure_future(wake.wait()) if wake is not None else None
        if woken is not None:
            waits.append(woken)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if woken is not None:
                woken.cancel()
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        self.set(self.t + seconds)

    def set(self, when: float) -> None:
        """Move to `when` and end every wait whose deadline it reached."""
        self.t = when
        for deadline, future in list(self._sleepers):
            if deadline <= when and not future.done():
                future.set_result(None)
                self._sleepers.remove((deadline, future))

    async def idle(self, waiters: int = 1) -> None:
        """Until at least `waiters` tasks wait on the clock (what they had to do is done)."""
        while self.waiting < waiters:
            self._changed.clear()
            await self._changed.wait()
