"""Consolidation: the older part of a conversation folded into one summary.

The summary is written by a dedicated call without tools; Heron then quotes every message the
user wrote in the folded part itself, verbatim from the record, and adds the work state and
todos. A failed summary changes nothing (the next turn retries); the third failing turn in a
row writes a deterministic fallback instead, so a broken summarizer cannot stall a conversation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass

from heron.compaction import records as rec
from heron.compaction.core import KEEP_MESSAGES, ContextDeps
from heron.compaction.summary import (
    SUMMARY_SYSTEM,
    archive_room,
    clip,
    digest,
    fallback_facts,
    parse_summary,
    quotes_of,
    render_summary,
    sections,
    state_block,
    transcript,
)
from heron.context.history import BranchState, load_branch, load_branch_async, system_for, view_of
from heron.context.tokens import estimate_message, estimate_messages, estimate_text
from heron.context.view import turn_starts
from heron.errors import HeronError, one_line
from heron.messages import Message, Text, plural
from heron.request import ChatRequest
from heron.store import StoredMessage, work
from heron.store import compactions as folds

log = logging.getLogger(__name__)
FAILED_TURNS_BEFORE_FALLBACK = 3


@dataclass
class CompactionReport:
    kind: str  # consolidation | fallback | inflight | none | failed
    reason: str
    rows_folded: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    compaction_id: int | None = None
    error: str | None = None
    said: str = ""  # kind "failed": the error on one line without its hint, for a notice
    why: str = "the conversation is already short"  # kind "none": why nothing could be folded
    note: str = ""  # how it was written, when not the usual way (NO_MODEL_SUMMARY)
    memory: str = ""  # memory's pass over the folded rows did not run: what the person is told

    @property
    def changed(self) -> bool:
        return self.compaction_id is not None

    @property
    def no_gain(self) -> bool:
        """Nothing was folded because the fold would not have shrunk the context."""
        return self.kind == "none" and self.why.startswith(NO_GAIN)

    def describe(self) -> str:
        if self.kind == "none":
            return f"Nothing to compact: {self.why}."
        if self.kind == "failed":
            return f"Compaction failed ({self.error}); nothing was changed. It is retried later."
        return (
            f"Compacted {plural(self.rows_folded, 'message')} ({self.note or self.kind}): about "
            f"{self.tokens_before} tokens of context became {self.tokens_after}."
        )


def choose_cut(state: BranchState, recent: int | None = None) -> int | None:
    """Index of the first row kept verbatim: the latest row that starts a turn with at least
    KEEP_MESSAGES rows from it on, after the current fold; None when nothing can be folded.
    `recent`: the tokens the kept turns may take; when the last KEEP_MESSAGES rows are more,
    fewer whole turns are kept (the last one always), so the view lands well under the
    trigger and the next consolidation is several turns away."""
    rows = state.rows
    start, starts = _turn_starts(state)
    best = next((i for i in reversed(starts) if len(rows) - i >= KEEP_MESSAGES), None)
    if recent is None or not starts:
        return best
    size = 0
    sizes = {}
    for i in range(len(rows) - 1, start, -1):
        size += estimate_message(rows[i].wire)
        sizes[i] = size
    if best is not None and sizes[best] <= recent:
        return best
    if best is None and sizes[starts[0]] <= recent:
        return None  # a short conversation that fits: nothing to fold, as before
    fitting = [i for i in starts if sizes[i] <= recent]
    return fitting[0] if fitting else starts[-1]


def _turn_starts(state: BranchState) -> tuple[int, list[int]]:
    """Where the rows after the current fold begin, and where each of their turns but the
    first starts (the places a cut can go): a turn's auto-recall pair is part of it, so the
    last turn, always kept, keeps the evidence found for its message."""
    rows, plan = state.rows, state.plan
    ids = [r.id for r in rows]
    start = ids.index(plan.folded_upto) + 1 if plan.folded_upto in ids else 0
    messages = [r.message for r in rows]
    starts = [i for i in turn_starts(messages, start) if rows[i].id not in plan.compacted]
    return start, starts


def nothing_to_fold(state: BranchState, recent: int) -> str:
    """Why `choose_cut` found no cut, for /compact to say (it said only "the conversation is
    already short", at half the window after a long turn)."""
    _, starts = _turn_starts(state)
    if not starts:
        why = "everything since the last summary is one turn, and the latest turn is kept whole"
        if state.plan.checkpoints:  # a long turn checkpointed in flight
            why += " (its earlier steps are already folded into checkpoints)"
        return why
    # What choose_cut measured: the turns after the first (it said "the turns since the last
    # summary (about 462 tokens) fit in the part kept whole (300 tokens)", the first included).
    size = sum(estimate_message(r.wire) for r in state.rows[starts[0] :])
    return (
        f"the conversation since the last summary is short: fewer than {KEEP_MESSAGES} "
        f"messages follow its first turn, and they (about {size:,} tokens) fit in the part "
        f"of the window kept whole ({recent:,} tokens)"
    )


def _prompt(deps: ContextDeps, state: BranchState, messages: list[Message]) -> str:
    previous = state.consolidation
    facts = previous.meta.get("facts", "") if previous else ""
    ws = previous.working_state if previous else ""
    text = transcript(messages)
    room = deps.budget.input * 3 // 5  # tokens: keep the newest part when it cannot all fit
    size = estimate_text(text)
    if size > room:
        text = "[… older part left out …]\n" + text[-(len(text) * room // size) :]
    return (
        f"Previous facts:\n{facts or '(none)'}\n\nPrevious working state:\n{ws or '(none)'}\n\n"
        f"New part of the conversation:\n{text}"
    )


async def summarize(deps: ContextDeps, prompt: str) -> tuple[str, str, str]:
    """(facts, working state, this part) from the model; raises when it fails or does not
    write."""
    request = ChatRequest(
        model=deps.provider.model,
        system=SUMMARY_SYSTEM,
        messages=[Message("user", [Text(prompt)])],
        tools=[],
        max_tokens=min(deps.budget.output, 2_000),
    )
    reply = await deps.chat(request, "summary")
    if reply.tool_calls or not reply.text.strip():
        raise ValueError("the summarizer wrote no summary")
    facts, ws = parse_summary(reply.text)
    return facts, ws, sections(reply.text).get("this part", "")


def _count_failure(deps: ContextDeps, conversation_id: int, turn_id: int | None) -> int:
    """Failing turns in a row, this one included (several attempts in one turn count once)."""
    state = rec.context_state(deps.store, conversation_id)
    if turn_id is not None and state.last_failed_turn == turn_id:
        return state.failed_turns
    failed = state.failed_turns + 1
    rec.set_context_state(
        deps.store, conversation_id, rec.ContextState(failed, turn_id, state.idle_retry_after)
    )
    return failed


def _reset_failures(deps: ContextDeps, conversation_id: int) -> None:
    state = rec.context_state(deps.store, conversation_id)
    if state.failed_turns:
        rec.set_context_state(
            deps.store, conversation_id, rec.ContextState(0, None, state.idle_retry_after)
        )


async def consolidate(
    deps: ContextDeps,
    conversation_id: int,
    agent: str,
    *,
    reason: str,
    turn_id: int | None = None,
    count_failures: bool = True,
) -> CompactionReport:
    """Fold everything before the last turns into a summary, if anything can be folded."""
    # The whole branch: the summary quotes every user message up to the cut, earlier folds too.
    state = await load_branch_async(deps.store, conversation_id, full=True)
    # Off the loop: the cut, the size and the prompt each walk the whole branch (tens of
    # thousands of rows in a long conversation, idle compaction's first pass over it).
    planned = await asyncio.to_thread(_plan, deps, agent, state, reason in OPTIONAL)
    if isinstance(planned, str):
        return CompactionReport("none", reason, why=planned)
    cut, start, before, new_rows, prompt = planned
    if not await _go_on(deps, conversation_id):
        return CompactionReport("none", reason, why=MOVED_ON)
    kind, error, note = "consolidation", None, ""
    chunk = ""
    try:
        if not deps.model_summary:
            raise NoModelSummary(NO_MODEL_SUMMARY)
        facts, ws, chunk = await summarize(deps, prompt)
    except NoModelSummary as e:  # a consolidation still: only its facts are Heron's
        facts, ws = _fallback(state, new_rows)
        note = str(e)
    except Exception as e:  # any failure of the summarizer leaves the conversation as it was
        # INFO, without the error's hint: WARNING shows on a chat's screen, and the hint
        # ("try again in a while") read as the turn failing, which goes on.
        said = one_line(e.summary if isinstance(e, HeronError) else str(e))
        log.info("consolidation summary failed, nothing folded: %s", said)
        error = f"{type(e).__name__}: {e}"
        failed = FAILED_TURNS_BEFORE_FALLBACK
        if count_failures:
            count = _count_failure
            failed = await deps.store.call(count, deps, conversation_id, turn_id, off_loop=True)
        if not count_failures or failed < FAILED_TURNS_BEFORE_FALLBACK:
            return CompactionReport("failed", reason, error=error, said=said)
        facts, ws = _fallback(state, new_rows)
        kind = "fallback"
    if not await _go_on(deps, conversation_id):
        return CompactionReport("none", reason, why=MOVED_ON)
    chunk = chunk or digest([r.message for r in new_rows])
    written = Written(kind, facts, ws, chunk, error)
    drafted = await deps.store.call(_draft, deps, state, cut, written, off_loop=True)
    gain = ""
    if reason in OPTIONAL:
        gain = await asyncio.to_thread(_no_gain, deps, state, cut, drafted.summary, before, "")
    if gain:
        return CompactionReport("none", reason, why=gain)
    # Memory's pass over what is about to leave the view; not a tiny model's (its picks are as
    # slow and unusable as its summary): the review cursor stays, a larger model's review reads
    # these words later.
    memory = None
    if deps.before_fold is not None and deps.model_summary:
        memory = await deps.before_fold(deps, conversation_id, [r.id for r in new_rows], reason)
        if not await _go_on(deps, conversation_id):
            return CompactionReport("none", reason, why=MOVED_ON)
    cid = await deps.store.call(
        _record, deps, state, cut, reason, written, drafted, before, off_loop=True
    )
    if deps.after_fold is not None:  # the next prompt takes memory as it is now
        await deps.after_fold(conversation_id)
    after = _conversation_tokens(deps, agent, await load_branch_async(deps.store, conversation_id))
    await deps.store.call(folds.set_tokens_after, deps.store, cid, after, off_loop=True)
    folded = cut - start
    report = CompactionReport(kind, reason, folded, before, after, cid, error, note=note)
    report.memory = memory or ""
    return report


MOVED_ON = "the conversation moved on while it waited"
NO_MODEL_SUMMARY = (
    "this small model is not asked for summaries nor for memory's picks; what you wrote is "
    "quoted, and a review with a larger model reads it"
)


class NoModelSummary(Exception):
    """The model is not asked for a summary (ContextDeps.model_summary is False)."""


def _fallback(state: BranchState, new_rows: list[StoredMessage]) -> tuple[str, str]:
    """(facts, working state) written without the model: the calls made and each result's
    start after the previous facts; the previous working state."""
    previous = state.consolidation
    facts = fallback_facts(
        [r.message for r in new_rows], previous.meta.get("facts", "") if previous else ""
    )
    return facts, previous.working_state if previous else ""


async def _go_on(deps: ContextDeps, conversation_id: int) -> bool:
    """Whether a background consolidation goes on to its next phase (`deps.between`)."""
    return deps.between is None or await deps.between(conversation_id)


def _plan(
    deps: ContextDeps, agent: str, state: BranchState, optional: bool = True
) -> tuple[int, int, int, list[StoredMessage], str] | str:
    """Where to cut, where the rows after the current fold start, the conversation's size
    before, the rows to fold and the summary's prompt; or why nothing can be folded (for an
    `optional` fold, also when it would gain too little)."""
    recent = deps.budget.share(deps.budget.shares.recent)
    cut = choose_cut(state, recent)
    if cut is None:
        return nothing_to_fold(state, recent)
    before = _conversation_tokens(deps, agent, state)
    ids = [r.id for r in state.rows]
    start = ids.index(state.plan.folded_upto) + 1 if state.plan.folded_upto in ids else 0
    new_rows = [r for r in state.rows[start:cut] if r.id not in state.plan.compacted]
    # Before asking the model: the least any summary of these rows holds (the user's words
    # quoted, the parts' digests; no facts, no state) may already be as long as what it would
    # replace, as for one short turn a /compact folds.
    if optional:
        least = Written("consolidation", "", "", digest([r.message for r in new_rows]))
        floor = _render(deps, state, cut, least, "").summary
        gain = _no_gain(deps, state, cut, floor, before, " or more")
        if gain:
            return gain
    return cut, start, before, new_rows, _prompt(deps, state, [r.wire for r in new_rows])


# A fold that would not shrink the context by this part of it is not made: it would break the
# provider's cached prefix (a new system prompt) for little or nothing. One short turn folded
# by /compact grew the context ("about 827 tokens became 867"): the archive quotes the
# person's words verbatim under its headers.
MIN_GAIN = 0.1
# Only a fold nothing forces is weighed so: a /compact by hand and the idle sweep's. A fold the
# conversation's budget or a window overflow calls for is made whatever it gains (the view's
# own budget then turns long quoted words into pointers).
OPTIONAL = frozenset({"manual", "idle"})
NO_GAIN = "nothing to gain"
NOTHING_TO_GAIN = (
    NO_GAIN + ": the summary would be about as long as what it replaces (about "
    "{before:,} tokens of context would become {after:,}{more}); the conversation is left as "
    "it is"
)


def _no_gain(
    deps: ContextDeps, state: BranchState, cut: int, summary: str, before: int, more: str
) -> str:
    """Why a fold at `cut` with `summary` is not worth making, or "" when it is."""
    ids = [r.id for r in state.rows]
    plan = dataclasses.replace(state.plan, folded_upto=ids[cut - 1])
    view = view_of(deps, BranchState(state.rows, plan, None))
    after = deps.calibration.tokens(estimate_messages(view) + estimate_text(summary))
    if after <= before * (1 - MIN_GAIN):
        return ""
    return NOTHING_TO_GAIN.format(before=before, after=after, more=more)


def _conversation_tokens(
    deps: ContextDeps, agent: str, state: BranchState, view: list[Message] | None = None
) -> int:
    """The conversation's size: its view (`view`: already derived from `state`) plus the
    archived summary (the fixed prefix aside)."""
    summary = state.consolidation.summary if state.consolidation else ""
    view = view_of(deps, state) if view is None else view
    raw = estimate_messages(view) + estimate_text(summary)  # the tool schemas are not history
    return deps.calibration.tokens(raw)


@dataclass(frozen=True)
class Written:
    """What a consolidation writes: by the model, or by the fallback."""

    kind: str  # consolidation | fallback
    facts: str  # level 2: everything so far
    working_state: str
    chunk: str  # level 1: the part folded now
    error: str | None = None


MAX_CHUNKS = 50  # level-1 summaries kept in a consolidation's record (the newest are shown)


@dataclass(frozen=True)
class Drafted:
    """A consolidation's archive as it would be recorded."""

    summary: str
    facts: str
    working_state: str
    chunks: list[list[object]]


def _draft(deps: ContextDeps, state: BranchState, cut: int, w: Written) -> Drafted:
    conversation_id = state.rows[0].conversation_id
    extra = state_block(
        work.work_state(deps.store, conversation_id), work.todos(deps.store, conversation_id)
    )
    return _render(deps, state, cut, w, extra)


def _render(deps: ContextDeps, state: BranchState, cut: int, w: Written, extra: str) -> Drafted:
    """The archive a fold at `cut` writes; `extra`: the work state and todos block."""
    folded = state.rows[:cut]  # every row up to the cut, earlier folds included
    previous = state.consolidation
    ids = [r.id for r in folded]
    start = ids.index(previous.last_row_id) + 1 if previous and previous.last_row_id in ids else 0
    chunks = [*(previous.meta.get("chunks", []) if previous else [])]
    chunks = [*chunks, [folded[min(start, len(folded) - 1)].id, folded[-1].id, w.chunk]]
    chunks = chunks[-MAX_CHUNKS:]
    budget = deps.budget
    room = archive_room(budget.share(budget.shares.archive), budget.share(budget.shares.user_words))
    facts, ws = clip(w.facts, room.facts), clip(w.working_state, room.working)
    summary = render_summary(facts, ws, quotes_of(folded), extra, room, [tuple(c) for c in chunks])
    return Drafted(summary, facts, ws, chunks)


def _record(
    deps: ContextDeps,
    state: BranchState,
    cut: int,
    reason: str,
    w: Written,
    drafted: Drafted,
    before: int,
) -> int:
    conversation_id = state.rows[0].conversation_id
    folded = state.rows[:cut]
    meta = {
        "facts": drafted.facts,
        "chunks": drafted.chunks,
        **({"error": w.error} if w.error else {}),
    }
    cid = folds.add_compaction(
        deps.store,
        conversation_id,
        kind=w.kind,
        reason=reason,
        summary=drafted.summary,
        working_state=drafted.working_state,
        first_row_id=folded[0].id,
        last_row_id=folded[-1].id,
        rows_folded=len(folded),
        tokens_before=before,
        meta=meta,
    )
    _reset_failures(deps, conversation_id)
    return cid


def conversation_tokens(deps: ContextDeps, conversation_id: int, agent: str) -> int:
    return _conversation_tokens(deps, agent, load_branch(deps.store, conversation_id))


__all__ = ["CompactionReport", "choose_cut", "consolidate", "conversation_tokens", "system_for"]
