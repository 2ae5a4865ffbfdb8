"""Waiting in async tests for something another task does: polled, with a generous limit (the
machine running the suite is often busy; the limit only matters when the test fails)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

UNTIL_S = 20.0


async def until(predicate: Callable[[], object], timeout: float = UNTIL_S) -> None:
    """Return once `predicate()` is true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"condition not reached in {timeout:g} s"
        await asyncio.sleep(0.005)
