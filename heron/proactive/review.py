"""The nightly review of memory: a pass over what was said since the last review.

Once a day (by default), while nobody is working with Heron, the pass reads each conversation
the person took part in from its review cursor on, with the rest of it as context, and proposes
facts and lessons (heron/memory/extract.py's review pass), then looks at memory as a whole for
merges (an entry another already covers is proposed for removal), removals of what no longer
holds, and rewrites of lessons (the tidy pass). Everything it finds goes to the review queue;
it never writes memory itself: only the person keeps a suggestion (`heron memory review`), and
each kept change is a commit of the memory folder (heron/memory/history.py), so
`heron memory undo` takes it back.

It is bounded: at most `model_calls` requests and `tokens` tokens a pass (a request that would
pass the token bound is not sent), whatever the number of conversations; what it did not reach
waits for the next pass, its cursors unmoved. A proposal that would change nothing (a fact or
lesson memory already holds word for word, a rewrite that says what the lesson says) is
dropped.

`nightly_review(engine)` is the pass; the scheduler (heron/proactive/scheduler.py, when it
runs) can call it as a job. Until then `review_when_idle` is its trigger: a small loop that
runs the pass when it is due and Heron has been idle long enough.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heron.context.tokens import estimate_text
from heron.errors import ProviderError
from heron.memory import queue
from heron.memory.guard import normalise
from heron.messages import Reply
from heron.request import ChatRequest, OnEvent
from heron.store import review_state

if TYPE_CHECKING:
    from heron.agent.engine import Engine
    from heron.agent.loop import AgentLoop
    from heron.providers.base import Provider

log = logging.getLogger(__name__)

MODEL_CALLS = 8
TOKENS = 300_000
EVERY_S = 24 * 3600.0
IDLE_S = 30 * 60.0
POLL_S = 10 * 60.0


class BudgetSpent(ProviderError):
    """The pass reached its bound; the request was not sent."""


@dataclass
class Budgeted:
    """A provider that counts what the pass spends and refuses past its bounds."""

    inner: Provider
    model_calls: int = MODEL_CALLS
    tokens: int = TOKENS
    calls: int = 0
    spent: int = 0
    refused: int = 0

    @property
    def model(self) -> str:
        return str(self.inner.model)

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        asked = estimate_text(request.system) + sum(estimate_text(m.text) for m in request.messages)
        if self.calls >= self.model_calls or self.spent + asked + request.max_tokens > self.tokens:
            self.refused += 1
            raise BudgetSpent("the nightly review reached its bound")
        self.calls += 1
        try:
            reply = await self.inner.chat(request, on_event)
        except ProviderError:
            self.spent += asked  # what was sent counts, even if nothing came back
            raise
        self.spent += max(reply.usage.total, asked)
        return reply


@dataclass
class ReviewReport:
    conversations: int = 0  # reviewed to their end
    left: int = 0  # not reached within the bounds: the next pass goes on
    suggested: list[int] = field(default_factory=list)
    dropped: int = 0  # no-op proposals
    model_calls: int = 0
    tokens: int = 0

    def text(self) -> str:
        return (
            f"nightly review: {self.conversations} conversation(s) read, {self.left} left for "
            f"the next pass; {len(self.suggested)} suggestion(s) queued, {self.dropped} no-op "
            f"dropped; {self.model_calls} model call(s), about {self.tokens:,} tokens"
        )


async def nightly_review(
    engine: Engine, *, model_calls: int = MODEL_CALLS, tokens: int = TOKENS
) -> ReviewReport:
    """One pass; it only adds suggestions to the review queue."""
    from heron.memory.extract import review_pass, tidy_pass

    report = ReviewReport()
    service, store = engine.memory, engine.store
    if service is None or engine.choice.embedded:
        return report  # no memory (ephemeral), or the tiny offline model that cannot do it
    provider = Budgeted(engine.provider, model_calls, tokens)
    pending = await store.call(review_state.unreviewed, store)
    for index, conversation_id in enumerate(pending):
        before = provider.refused
        cursor = await store.call(review_state.cursor_of, store, conversation_id)
        ids = await review_pass(provider, service, conversation_id)
        if provider.refused > before:  # not read: its cursor must not move past it
            await store.call(review_state.restore_cursor, store, conversation_id, cursor)
            report.left = len(pending) - index
            break
        report.conversations += 1
        report.suggested += ids
    if not report.left:
        report.suggested += await tidy_pass(provider, service)
    kept = await store.call(_drop_noops, service, report.suggested)
    report.dropped = len(report.suggested) - len(kept)
    report.suggested = kept
    report.model_calls, report.tokens = provider.calls, provider.spent
    await store.call(review_state.record_run, store)
    return report


def _drop_noops(service: Any, ids: list[int]) -> list[int]:
    """Suggestions that would change nothing are dropped from the queue."""
    held = {normalise(e.text) for e in service.entries()}
    kept: list[int] = []
    for number in ids:
        s = queue.get(service.store, number)
        if s is None:
            continue
        same_text = s.kind in ("fact", "lesson") and normalise(s.text or "") in held
        same_rewrite = s.kind == "amendment" and normalise(s.text or "") == normalise(
            s.reason or ""
        )
        if same_text or same_rewrite:
            queue.decide(service.store, number, "dropped")
        else:
            kept.append(number)
    return kept


Sleep = Callable[[float], Awaitable[None]]


async def review_when_idle(
    engine: Engine,
    loop: AgentLoop,
    *,
    every_s: float = EVERY_S,
    idle_s: float = IDLE_S,
    poll_s: float = POLL_S,
    sleep: Sleep = asyncio.sleep,
    now: Callable[[], float] = time.time,
) -> None:
    """Until cancelled: the nightly review when it is due and nothing has happened for
    `idle_s` (no turn running, no message stored)."""
    store = engine.store
    while True:
        await sleep(poll_s)
        last = await store.call(review_state.last_run, store)
        if last is not None and now() - last < every_s:
            continue
        said = await store.call(review_state.last_message_at, store)
        if loop.busy or (said is not None and now() - said < idle_s):
            continue
        try:
            report = await nightly_review(engine)
        except Exception:  # a failed pass must not take the chat down; it runs again later
            log.exception("the nightly review failed")
            continue
        log.info("%s", report.text())
