"""Idle compaction: a conversation left alone for idleCompactAfterMinutes, with no turn
running, is consolidated in the background. Its summary enters the next turn as the archived
context section. A failed summary leaves the conversation untouched and is retried after ten
minutes.

A sweep goes one conversation at a time, each looked at (its branch read, off the loop) only
when its turn comes, and waits for `quiet` before each (the AgentLoop's `person_first`): a serve
started on a home of hundreds of unconsolidated conversations works through them in the gaps
between the person's turns instead of competing with them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from heron.compaction import records as rec
from heron.compaction.consolidate import CompactionReport, choose_cut, consolidate
from heron.compaction.core import CompactionHost, ContextDeps, deps_for
from heron.context.history import load_branch
from heron.store.records import IDLE_COMPACT

log = logging.getLogger(__name__)
RETRY_AFTER_FAILURE_S = 600.0


@dataclass(frozen=True)
class Quiet:
    """When idle work may take a step (`wait`, awaited before each) and what stops a step under
    way (`interrupt`, returning when the person's turn starts: the step is then cancelled, its
    run recorded as interrupted, and taken again at a later sweep)."""

    wait: Callable[[], Awaitable[None]]
    interrupt: Callable[[], Awaitable[None]] | None = None


def _idle(
    deps: ContextDeps, now: float, conversation_id: int | None = None
) -> list[tuple[int, str]]:
    """Conversations idle long enough, with no running turn and no retry pending (or whether
    `conversation_id` still is one)."""
    cutoff = now - deps.idle_minutes * 60
    return rec.idle_conversations(deps.store, cutoff, now, conversation_id)


def _can_fold(deps: ContextDeps, conversation_id: int, now: float) -> int | None:
    """The conversation's head when it is still idle and has something to fold since its last
    consolidation (a turn may have run in it while the sweep waited); else None."""
    head = _still(deps, conversation_id, now)
    if head is None or choose_cut(load_branch(deps.store, conversation_id)) is None:
        return None
    return head


def _still(deps: ContextDeps, conversation_id: int, now: float) -> int | None:
    """The conversation's head while it is idle, None once it is not."""
    return rec.head_of(deps.store, conversation_id) if _idle(deps, now, conversation_id) else None


def _retry_later(deps: ContextDeps, conversation_id: int, now: float) -> None:
    state = rec.context_state(deps.store, conversation_id)
    rec.set_context_state(
        deps.store,
        conversation_id,
        rec.ContextState(state.failed_turns, state.last_failed_turn, now + RETRY_AFTER_FAILURE_S),
    )


async def compact_idle(
    engine: CompactionHost, now: float | None = None, quiet: Quiet | None = None
) -> list[CompactionReport]:
    """One sweep; `quiet` is awaited before each conversation is looked at."""
    deps = deps_for(engine)
    if deps.idle_minutes <= 0:
        return []
    now = time.time() if now is None else now
    reports = []
    for cid, agent in await deps.store.call(_idle, deps, now, off_loop=True):
        if quiet is not None:
            await quiet.wait()
        head = await deps.store.call(_can_fold, deps, cid, now, off_loop=True)
        if head is None:
            continue
        deps.between = None if quiet is None else _between(deps, quiet, head, now)
        report = await _unless_interrupted(_consolidate(deps, cid, agent), quiet)
        if report is None:  # the person came first: this conversation waits for a later sweep
            continue
        if report.kind == "failed" or report.no_gain:  # not again at every sweep
            await deps.store.call(_retry_later, deps, cid, now, off_loop=True)
        reports.append(report)
    return reports


def _between(
    deps: ContextDeps, quiet: Quiet, head: int, now: float
) -> Callable[[int], Awaitable[bool]]:
    """Between a consolidation's phases: wait for the person again, then go on only if the
    conversation is as the consolidation found it (still idle, the same head)."""

    async def go_on(conversation_id: int) -> bool:
        await quiet.wait()
        return _still(deps, conversation_id, now) == head  # one indexed row: inline

    return go_on


async def _unless_interrupted(
    step: Coroutine[Any, Any, CompactionReport], quiet: Quiet | None
) -> CompactionReport | None:
    """The step's report, or None when the person's turn started first: the step is then
    cancelled (its model call closed, nothing stored: a consolidation writes at its end)."""
    if quiet is None or quiet.interrupt is None:
        return await step
    task = asyncio.create_task(step)
    arrives = asyncio.ensure_future(quiet.interrupt())
    try:
        await asyncio.wait({task, arrives}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        arrives.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        log.info("idle compaction stepped aside for the person's turn")
        return None
    return task.result()


async def _consolidate(deps: ContextDeps, cid: int, agent: str) -> CompactionReport:
    """One idle consolidation, its summary (and memory's extraction) recorded as a run of the
    conversation (`idle-compact`) when the engine records them."""
    if deps.maintenance is None:
        return await consolidate(deps, cid, agent, reason="idle", count_failures=False)
    async with deps.maintenance(cid, IDLE_COMPACT) as sink:
        deps.on_call = sink
        try:
            report = await consolidate(deps, cid, agent, reason="idle", count_failures=False)
        finally:
            deps.on_call = None
        if report.kind == "failed":
            sink.fail(report.error or "the summary failed")
        return report


async def idle_loop(
    engine: CompactionHost, poll_s: float = 60.0, quiet: Quiet | None = None
) -> None:
    """Poll for idle conversations until cancelled."""
    while True:
        try:
            await compact_idle(engine, quiet=quiet)
        except Exception as e:  # the sweeper must outlive a bad conversation
            log.warning("idle compaction failed: %s", e)
        await asyncio.sleep(poll_s)
