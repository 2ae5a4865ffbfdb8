"""The face keeps its workers alive (heron/scale/spawn.py): a worker that dies is said on
stderr with how it ended and replaced after a backoff; a worker that dies at once, again and
again, is given up with the reason. Stand-in workers here (a Python one-liner that prints the
ready line, or exits at once); the real `heron worker` under a real serve is in
tests/test_scale_workers.py."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys

import pytest
from waiting import until

from heron.scale import spawn
from heron.scale.spawn import Staff

READY_THEN_WAIT = [
    sys.executable, "-c",
    "import time; print('heron worker: ready (stand-in)', flush=True); time.sleep(120)",
]  # fmt: skip
EXITS_AT_ONCE = [sys.executable, "-c", "import sys; sys.exit(3)"]


async def test_a_killed_worker_is_said_and_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawn, "FIRST_BACKOFF_S", 0.05)
    err = io.StringIO()
    staff = Staff(2, READY_THEN_WAIT, err=err)
    changes: list[int] = []
    staff.listeners.append(lambda: changes.append(staff.alive))
    await staff.start()
    try:
        assert staff.alive == 2 and staff.summary() == "2 of 2 workers alive"
        first = staff.slots[0].pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await until(lambda: staff.alive == 1, timeout=60.0)
        await until(lambda: staff.alive == 2, timeout=60.0)
        assert staff.slots[0].pid not in (None, first)
        said = err.getvalue()
        assert f"worker 1 (pid {first}) was killed by SIGKILL; starting another in 0 s" in said
        assert f"worker 1 is back (pid {staff.slots[0].pid})" in said
        assert 1 in changes and changes[-1] == 2  # the face heard it go and come back
    finally:
        await staff.close()
    assert all(s.proc is not None and s.proc.returncode is not None for s in staff.slots)


async def test_a_worker_that_dies_at_once_is_given_up_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spawn, "FIRST_BACKOFF_S", 0.01)
    err = io.StringIO()
    staff = Staff(1, EXITS_AT_ONCE, err=err)
    await asyncio.wait_for(staff.start(), 60)  # it returns: the face comes up all the same
    try:
        slot = staff.slots[0]
        assert slot.state == "paused" and staff.alive == 0 and not staff.coming
        said = err.getvalue().splitlines()
        assert said[0].endswith("exited with code 3 before it was ready; starting another in 0 s")
        assert said[-1].startswith(f"heron serve: worker 1 (pid {slot.pid}) exited with code 3")
        assert "3 times in a row within 30 s of its start: not restarting it" in said[-1]
        assert len(said) == 3  # three starts, then no more
        assert "so heron serve no longer restarts it" in staff.absent()
    finally:
        await staff.close()


async def test_a_worker_restarting_is_on_its_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a death and the next start the slot says when the next worker comes."""
    monkeypatch.setattr(spawn, "FIRST_BACKOFF_S", 30.0)
    staff = Staff(1, READY_THEN_WAIT, err=io.StringIO())
    await staff.start()
    try:
        pid = staff.slots[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await until(lambda: staff.slots[0].state == "restarting", timeout=60.0)
        assert staff.alive == 0 and staff.coming
        assert "was killed by SIGKILL; heron serve starts another in" in staff.absent()
        assert staff.counts() == {"alive": 0, "of": 1}
    finally:
        await staff.close()
