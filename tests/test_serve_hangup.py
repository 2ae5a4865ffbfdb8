"""SIGHUP (the terminal or SSH session the serve ran in closed) stops `heron serve` as SIGTERM
does, with its clean shutdown; under `nohup` (SIGHUP ignored) it stays ignored. In-process:
the stopper's handlers on this test's loop, the signal sent to this process."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from heron.serve.main import _Stopper


class _Runtime:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class _Server:
    should_exit = False
    force_exit = False


@pytest.fixture
def hangup_default() -> Iterator[None]:
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, before)


def _stopper() -> tuple[_Stopper, _Runtime, _Server]:
    runtime, server = _Runtime(), _Server()
    stopper: Any = _Stopper(runtime, server)  # type: ignore[arg-type]
    return stopper, runtime, server


async def test_sighup_stops_the_serve_as_sigterm_does(hangup_default: None) -> None:
    stopper, runtime, server = _stopper()
    stopper.install()
    try:
        # Checked first: without a handler the signal would end the test process.
        assert signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(100):
            if server.should_exit:
                break
            await asyncio.sleep(0.01)
    finally:
        stopper.remove()
    assert runtime.closed and server.should_exit
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL


async def test_sighup_ignored_under_nohup_stays_ignored(hangup_default: None) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    stopper = _stopper()[0]
    stopper.install()
    try:
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        stopper.remove()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
