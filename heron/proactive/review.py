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
waits for the next pass, each cursor moved past what was read and no further. A proposal that
would change nothing (a fact or lesson memory already holds word for word, a rewrite that says
what the lesson says) is dropped.

`nightly_review(engine)` is the pass. It runs as the scheduler's built-in job (mode
"review", one row made by migration m010): `sync_job` brings that row in line with config.toml
(`[review] time` in the user's timezone, `[review] enabled`) when a scheduler starts, and the
scheduler (heron/proactive/scheduler.py) fires it like any job, with its lease (once across
processes), catch-up rules and a `job_runs` row for every fire or skip, skipping it while a
turn the person started runs.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heron.context.tokens import estimate_text
from heron.errors import ProviderError
from heron.memory import queue
from heron.memory.guard import normalise
from heron.messages import Reply
from heron.request import ChatRequest, OnEvent
from heron.store import jobs, review_state
from heron.store.jobs import Job
from heron.store.records import NIGHTLY_REVIEW, NIGHTLY_TIDY
from heron.store.schedule import Schedule, user_timezone

if TYPE_CHECKING:
    from heron.agent.engine import Engine
    from heron.config import Config
    from heron.providers.base import Provider

log = logging.getLogger(__name__)

MODEL_CALLS = 8
# Heron's own conversation the tidy pass is recorded in: memory as a whole is no one
# conversation's (internal: never listed, heron/store/records.py).
TIDY_CONVERSATION = "memory-review"
TOKENS = 300_000


class BudgetSpent(ProviderError):
    """The pass reached its bound; the request was not sent."""


@dataclass
class Budgeted:
    """A provider that counts what the pass spends and refuses past its bounds. Its `inner`
    is the engine's provider recording into the run of the conversation being read."""

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
    refused: list[str] = field(default_factory=list)  # why each fact picked was not queued
    model_calls: int = 0
    tokens: int = 0

    def text(self) -> str:
        return (
            f"nightly review: {self.conversations} conversation(s) read, {self.left} left for "
            f"the next pass; {len(self.suggested)} suggestion(s) queued, {self.dropped} no-op "
            f"dropped{self._refusals()}; {self.model_calls} model call(s), about "
            f"{self.tokens:,} tokens"
        )

    def _refusals(self) -> str:
        """The facts the model picked that were not queued, counted by why: "; 1 pick(s)
        refused (1 in quotation marks (someone else's words))"."""
        if not self.refused:
            return ""
        counts = Counter(self.refused)
        said = ", ".join(f"{n} {why}" for why, n in counts.most_common())
        return f"; {len(self.refused)} pick(s) refused ({said})"


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
    window = engine.window
    pending = await store.call(review_state.unreviewed, store)
    for index, conversation_id in enumerate(pending):
        before = provider.refused
        # Each pass a run of the conversation it read (a refused request is never sent, so
        # the recording sits under the bound: only what was sent is recorded). The pass moves
        # the conversation's cursor past what its answered calls read, no further.
        async with engine.maintenance(conversation_id, NIGHTLY_REVIEW) as run:
            provider.inner = run.provider(engine.provider, "review")
            ids = await review_pass(
                provider, service, conversation_id, window, refused=report.refused
            )
        report.suggested += ids
        if provider.refused > before:  # the bound: this one and the rest wait
            report.left += len(pending) - index
            break
        if await store.call(review_state.has_unread, store, conversation_id):
            report.left += 1  # its calls ran out before its end: the next pass goes on
        else:
            report.conversations += 1
    if not report.left:
        # Memory as a whole belongs to no conversation: its run is in Heron's own.
        tidy_in = await store.call(store.open_conversation, TIDY_CONVERSATION, "default")
        async with engine.maintenance(tidy_in.id, NIGHTLY_TIDY) as run:
            provider.inner = run.provider(engine.provider, "tidy")
            report.suggested += await tidy_pass(provider, service, window=window)
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


JOB_PROMPT = (
    "The nightly review of memory: proposes facts, lessons, merges and removals for heron "
    "memory review; never writes memory itself"
)


def job_schedule(config: Config) -> tuple[Schedule, bool | None]:
    """The review job's schedule (daily at `[review] time`, local) and whether config.toml
    says it runs: `[review] enabled`, else off when the older `[memory] review_every_hours` is
    0, else None (whatever the job row says)."""
    hour, minute = config.review.hour_minute
    schedule = Schedule("cron", f"{minute} {hour} * * *", user_timezone(config.agent.timezone))
    enabled = config.review.enabled
    if enabled is None and config.memory.review_every_hours == 0:
        enabled = False
    return schedule, enabled


async def sync_job(engine: Engine, now: float) -> Job:
    """The built-in review job, as config.toml has it now."""
    schedule, enabled = job_schedule(engine.settings.config)
    store = engine.store
    return await store.call(jobs.sync_review, store, schedule, enabled, now, JOB_PROMPT)


async def run_pass(engine: Engine) -> str:
    """One pass as the job runs it: its report line goes into the job's run row."""
    report = await nightly_review(engine)
    log.info("%s", report.text())
    return report.text()
