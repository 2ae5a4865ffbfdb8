"""The scheduler and heartbeat of `heron serve`, and the review-only scheduler of a `heron chat`
without a serve (see the package's docstring). Kept out of the package's `__init__`, so a
`heron run` that only needs subagents, goals and questions does not import the scheduler and its
cron parser at start-up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial

from heron.agent.engine import Engine, offers_tools
from heron.agent.loop import AgentLoop
from heron.errors import HeronError
from heron.proactive import review
from heron.proactive.clock import Clock, FakeClock, SystemClock
from heron.proactive.heartbeat import Heartbeat
from heron.proactive.scheduler import Scheduler
from heron.store.jobs import REVIEW

__all__ = [
    "Clock",
    "FakeClock",
    "Heartbeat",
    "Scheduler",
    "SystemClock",
    "run_asked_here",
    "run_proactive",
    "run_review_only",
]

log = logging.getLogger(__name__)


def services(loop: AgentLoop, engine: Engine, clock: Clock) -> tuple[Scheduler, Heartbeat | None]:
    """The scheduler and, unless `heartbeat_minutes` is 0, the heartbeat, watching the loop
    for the ends of their turns."""
    agent = engine.settings.config.agent
    scheduler = _scheduler(loop, engine, clock)
    scheduler.watch(loop)
    heartbeat = None
    if agent.heartbeat_minutes > 0:
        heartbeat = Heartbeat(
            engine.store,
            loop.bus,
            clock,
            engine.settings.paths.workspace,
            agent.heartbeat_minutes,
            loop.user_turn_running,
            tools=offers_tools(engine.choice),
        )
        heartbeat.watch(loop)
    return scheduler, heartbeat


async def run_proactive(
    loop: AgentLoop, engine: Engine | None = None, clock: Clock | None = None
) -> None:
    """Run the scheduler and the heartbeat until cancelled; the `schedule` tool of this
    process wakes the scheduler when it makes a job."""
    engine = engine or loop.engine
    clock = clock or SystemClock()
    scheduler, heartbeat = services(loop, engine, clock)
    await _sync_review(engine, clock)
    engine.attached.jobs_changed = scheduler.poke
    tasks = [asyncio.create_task(scheduler.run())]
    if heartbeat is not None:
        tasks.append(asyncio.create_task(heartbeat.run()))
    try:
        await asyncio.gather(*tasks)
    finally:
        engine.attached.jobs_changed = None
        for watched in (scheduler, heartbeat):
            if watched is not None:
                watched.unwatch()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _sync_review(engine: Engine, clock: Clock) -> None:
    try:
        await review.sync_job(engine, clock.now())
    except HeronError as e:  # a bad [agent] timezone: the review keeps its last schedule
        log.warning("the nightly review's schedule was not updated: %s", e)


async def run_review_only(loop: AgentLoop, engine: Engine, clock: Clock | None = None) -> None:
    """A scheduler of the built-in review job alone, until cancelled: what a `heron chat`
    without a serve runs, so the nightly review still happens, once across processes."""
    clock = clock or SystemClock()
    scheduler = _scheduler(loop, engine, clock, modes=(REVIEW,))
    await _sync_review(engine, clock)
    await scheduler.run()


async def run_asked_here(
    loop: AgentLoop,
    engine: Engine,
    job_id: int,
    settle: Callable[[], Awaitable[None]],
    clock: Clock | None = None,
) -> bool:
    """Run job `job_id`'s asked run in this process, to its end (`settle`: until the loop's
    turns and what they sent are done): `heron jobs run-now` when no serve runs. Its run is
    recorded as a serve's would be. False when another scheduler took it first (a chat's,
    for the built-in review)."""
    scheduler = _scheduler(loop, engine, clock or SystemClock())
    scheduler.watch(loop)
    try:
        if not await scheduler.fire_asked(job_id):
            return False
        await scheduler.drain()
        await settle()
        return True
    finally:
        scheduler.unwatch()
        await scheduler.release()


def _scheduler(
    loop: AgentLoop, engine: Engine, clock: Clock, modes: tuple[str, ...] | None = None
) -> Scheduler:
    return Scheduler(
        engine.store,
        loop.bus,
        clock,
        grace_s=engine.settings.config.agent.catch_up_grace_minutes * 60.0,
        review=partial(review.run_pass, engine),
        user_busy=loop.user_turn_running,
        modes=modes,
        tools=offers_tools(engine.choice),
        brief=engine.choice.profile.brief_prompt,
        zone=engine.settings.timezone,
    )
