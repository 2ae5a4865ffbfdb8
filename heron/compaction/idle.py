"""Idle compaction: a conversation left alone for idleCompactAfterMinutes, with no turn
running, is consolidated in the background. Its summary enters the next turn as the archived
context section. A failed summary leaves the conversation untouched and is retried after ten
minutes."""

from __future__ import annotations

import asyncio
import logging
import time

from heron.compaction import records as rec
from heron.compaction.consolidate import CompactionReport, choose_cut, consolidate
from heron.compaction.core import CompactionHost, ContextDeps, deps_for
from heron.context.history import load_branch
from heron.store.records import IDLE_COMPACT

log = logging.getLogger(__name__)
RETRY_AFTER_FAILURE_S = 600.0


def _candidates(deps: ContextDeps, now: float) -> list[tuple[int, str]]:
    """Conversations idle long enough, with no running turn and no retry pending, that have
    something to fold since their last consolidation."""
    cutoff = now - deps.idle_minutes * 60
    rows = rec.idle_conversations(deps.store, cutoff, now)
    out = []
    for cid, agent in rows:
        if choose_cut(load_branch(deps.store, cid)) is not None:
            out.append((cid, agent))
    return out


def _retry_later(deps: ContextDeps, conversation_id: int, now: float) -> None:
    state = rec.context_state(deps.store, conversation_id)
    rec.set_context_state(
        deps.store,
        conversation_id,
        rec.ContextState(state.failed_turns, state.last_failed_turn, now + RETRY_AFTER_FAILURE_S),
    )


async def compact_idle(engine: CompactionHost, now: float | None = None) -> list[CompactionReport]:
    deps = deps_for(engine)
    if deps.idle_minutes <= 0:
        return []
    now = time.time() if now is None else now
    reports = []
    for cid, agent in await deps.store.call(_candidates, deps, now, off_loop=True):
        report = await _consolidate(deps, cid, agent)
        if report.kind == "failed":
            await deps.store.call(_retry_later, deps, cid, now, off_loop=True)
        reports.append(report)
    return reports


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


async def idle_loop(engine: CompactionHost, poll_s: float = 60.0) -> None:
    """Poll for idle conversations until cancelled."""
    while True:
        try:
            await compact_idle(engine)
        except Exception as e:  # the sweeper must outlive a bad conversation
            log.warning("idle compaction failed: %s", e)
        await asyncio.sleep(poll_s)
