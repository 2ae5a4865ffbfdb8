"""Before a turn's first model call: consolidate if the conversation grew past its share of the
window, then hand the engine the system prompt, the view and the run's governor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from heron.compaction import records as rec
from heron.compaction.consolidate import CompactionReport, _conversation_tokens, consolidate
from heron.compaction.core import CompactionHost, ContextDeps, deps_for, tokens_of
from heron.compaction.governor import Governor
from heron.context.history import BranchState, load_branch, load_branch_async, system_for, view_of
from heron.context.long_message import notices
from heron.context.tokens import estimate_text
from heron.messages import File, Message, plural
from heron.providers.wire import ModelCallRecord


@dataclass
class Prepared:
    system: str
    messages: list[Message]
    governor: Governor
    report: CompactionReport | None = None
    notices: list[str] = field(default_factory=list)  # for the user, once (consolidated, large)


async def prepare_turn(
    engine: CompactionHost,
    conversation: Any,
    agent: str,
    turn_id: int,
    user_row_id: int,
    *,
    window: int | None = None,
    heavy: bool = False,
    on_call: Callable[[ModelCallRecord], Awaitable[None]] | None = None,
) -> Prepared:
    # A long branch is read and shaped off the loop, and so is the view of a turn that brings
    # files (`heavy`): a long text file is read, decoded and saved to be shown by head and tail.
    store = engine.compaction_setup().store
    slow = heavy or store.is_long(conversation.id)
    measured = await store.call(_measure, engine, conversation.id, agent, window, off_loop=slow)
    deps, state, size, ready = measured
    deps.on_call = on_call  # the summary below and the governor's checkpoints are recorded
    report = None
    if size > deps.budget.trigger(_fixed(deps, state, ready[0])):
        report = await consolidate(
            deps, conversation.id, agent, reason="threshold", turn_id=turn_id
        )
        if report.changed:
            state = await load_branch_async(deps.store, conversation.id)
            ready = await store.call(_assemble, deps, agent, state, off_loop=slow)
    system, view = ready
    if any(isinstance(p, File) for m in view if m.role == "user" for p in m.parts):
        # Rows name their attachments; the request carries their bytes (heron/store/files.py).
        view = await store.call(store.load_files, view, off_loop=True)
    governor = Governor(
        deps, conversation.id, system, user_row_id, turn_id, state, len(view), view=view
    )
    told = _notices(deps, state, user_row_id)
    if report is not None and report.changed:
        told[:0] = [consolidated_notice(report), *([report.memory] if report.memory else [])]
    elif report is not None and report.kind == "failed":
        told[:0] = [SUMMARY_FAILED_NOTICE.format(error=report.said)]
    return Prepared(system, view, governor, report, told)


# What a channel shows when a turn starts with a consolidation: `heron run` (stderr), the chat
# and the browser told each in-flight checkpoint but not these, which fold far more.
CONSOLIDATED_NOTICE = (
    "Compacted {messages} into a summary to fit the model's window "
    "(about {before:,} tokens became {after:,})."
)


# A failed summary leaves the conversation as it was and the turn goes on: said as that, not
# as the provider error's own hint ("try again in a while"), which read as the turn failing.
SUMMARY_FAILED_NOTICE = (
    "A summary of older messages failed ({error}); they are kept whole for now, this turn goes "
    "on without it and the next one tries again."
)


def consolidated_notice(report: CompactionReport) -> str:
    earlier = plural(report.rows_folded, "earlier message")
    return CONSOLIDATED_NOTICE.format(
        messages=earlier, before=report.tokens_before, after=report.tokens_after
    )


def _fixed(deps: ContextDeps, state: BranchState, system: str) -> int:
    """The request's part that a consolidation does not shrink: system prompt and tools,
    the archived summary aside."""
    summary = state.consolidation.summary if state.consolidation else ""
    return tokens_of(deps, system, []) - deps.calibration.tokens(estimate_text(summary))


def _notices(deps: ContextDeps, state: BranchState, user_row_id: int) -> list[str]:
    """The user's message of this turn (or a text file it attaches) too large for its share:
    say once what the model sees."""
    row = next((r for r in reversed(state.rows) if r.id == user_row_id), None)
    if row is None:
        return []
    read = deps.store.files.read
    limit = deps.budget.user_chars
    return notices(row.message, limit, deps.workspace, read, deps.calibration.tokens)


def _measure(
    engine: CompactionHost, conversation_id: int, agent: str, window: int | None
) -> tuple[ContextDeps, BranchState, int, tuple[str, list[Message]]]:
    """In one hop: the branch, its size, and the system prompt and view (derived once)."""
    deps = deps_for(engine, window)
    deps.found = rec.context_state(deps.store, conversation_id)
    state = load_branch(deps.store, conversation_id)
    system, view = _assemble(deps, agent, state)
    return deps, state, _conversation_tokens(deps, agent, state, view), (system, view)


def _assemble(deps: ContextDeps, agent: str, state: BranchState) -> tuple[str, list[Message]]:
    return system_for(deps, agent, state), view_of(deps, state)
