"""The face's say in the workers' polling interval (heron/scale/polling.py): slowed once the
face has been idle with nothing sent for a while, fast again before the next message is
queued. The queue here is an in-memory stand-in for DBOS's queue row; the test with real
workers is in tests/test_scale_workers.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from heron.scale.polling import PollGovernor


@dataclass
class Row:
    """The queue's polling interval as DBOS keeps it, and every write to it."""

    interval: float = 0.05
    writes: list[float] = field(default_factory=list)

    async def get_polling_interval_sec_async(self) -> float:
        return self.interval

    async def set_polling_interval_sec_async(self, value: float) -> None:
        self.interval = value
        self.writes.append(value)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _checks(governor: PollGovernor, quiet: list[bool], rounds: int = 3) -> None:
    task = asyncio.create_task(governor.run(lambda: quiet[0]))
    for _ in range(rounds):
        await asyncio.sleep(0.005)  # several of the governor's checks (check_s below)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _governor(row: Row, clock: Clock) -> PollGovernor:
    return PollGovernor(row, fast_s=0.05, slow_s=0.25, idle_after_s=60, check_s=0.001, clock=clock)


async def test_slowed_only_after_a_quiet_minute() -> None:
    row, clock = Row(), Clock()
    governor = _governor(row, clock)
    await governor.busy()
    clock.now += 59
    await _checks(governor, [True])
    assert row.writes == []  # not a minute yet
    clock.now += 2
    await _checks(governor, [False])
    assert row.writes == []  # a turn still runs or waits
    await _checks(governor, [True])
    assert (row.interval, row.writes, governor.slow) == (0.25, [0.25], True)


async def test_fast_again_before_the_next_message() -> None:
    row, clock = Row(), Clock()
    governor = _governor(row, clock)
    clock.now += 61
    await _checks(governor, [True])
    assert row.interval == 0.25
    await governor.busy()  # what the face awaits before it enqueues
    assert (row.interval, governor.slow) == (0.05, False)
    await governor.busy()
    assert row.writes == [0.25, 0.05]  # nothing written while already fast


async def test_slow_again_when_a_starting_worker_reset_it() -> None:
    row, clock = Row(), Clock()
    governor = _governor(row, clock)
    clock.now += 61
    await _checks(governor, [True])
    row.interval = 0.05  # a worker started: DBOS registered the queue with its own interval
    await _checks(governor, [True])
    assert row.interval == 0.25 and row.writes == [0.25, 0.25]


async def test_a_database_error_leaves_the_interval_and_the_watch_alive() -> None:
    class Down(Row):
        async def get_polling_interval_sec_async(self) -> float:
            raise OSError("connection refused")

    row, clock = Down(), Clock()
    governor = _governor(row, clock)
    clock.now += 61
    await _checks(governor, [True])  # the watch logs and goes on: no exception escapes
    assert row.writes == [] and not governor.slow
