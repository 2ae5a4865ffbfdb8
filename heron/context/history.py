"""The model-facing history of a conversation: its branch after the last /new, the plan that
compaction's records make of it (what is folded under a summary, what a checkpoint replaces),
and the system prompt and view derived from them.

Context owns this view; compaction writes the records it reads (heron/store/compactions.py) and
asks for the view through these functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from heron.context.prompt import PromptInputs, PromptMemo, build_system_prompt
from heron.context.view import ViewOptions, ViewPlan, derive_view
from heron.messages import Message
from heron.store import Store
from heron.store import compactions as folds
from heron.store.records import StoredMessage


class HistoryDeps(Protocol):
    """What the view needs of compaction's dependencies (compaction.core.ContextDeps)."""

    # Read-only members, so a frozen or plain dataclass satisfies the protocol.
    @property
    def prompt_inputs(self) -> Callable[[str, int | None], PromptInputs]:
        """(agent, conversation id) -> the inputs of the system prompt before compaction."""
        ...

    @property
    def prompts(self) -> PromptMemo | None:
        """The engine's built prompts, remembered."""
        ...

    def view_options(self) -> ViewOptions: ...


@dataclass(frozen=True)
class BranchState:
    # The branch after the last /new separator; when a consolidation is active and the state
    # was not loaded `full`, only from its last folded row (or an older row folded in flight)
    # on: what the view and the plan of the rows after the fold depend on. See load_branch.
    rows: list[StoredMessage]
    plan: ViewPlan
    consolidation: folds.Compaction | None  # the active one: its last row is in the branch


def plan_for(
    rows: list[StoredMessage],
    compactions: list[folds.Compaction],
    marks: dict[int, list[tuple[int, str]]],
) -> BranchState:
    ids = {r.id for r in rows}
    active = None
    for c in compactions:
        if c.is_consolidation and c.last_row_id in ids:
            active = c
    checkpoints: dict[int, str] = {}
    for c in compactions:
        if c.kind == "inflight" and c.anchor_row_id in ids:
            checkpoints[c.anchor_row_id] = c.summary  # the latest wins: it folds the earlier
    compacted = {
        mid
        for mid, found in marks.items()
        if mid in ids and any(m == "compacted" for _, m in found)
    }
    plan = ViewPlan(active.last_row_id if active else None, frozenset(compacted), checkpoints)
    return BranchState(rows, plan, active)


def after_separator(rows: list[StoredMessage]) -> list[StoredMessage]:
    """The rows the model may see: everything after the last /new separator."""
    for i in range(len(rows) - 1, -1, -1):
        if rows[i].kind == "separator":
            return rows[i + 1 :]
    return rows


def load_branch(store: Store, conversation_id: int, *, full: bool = False) -> BranchState:
    """The branch and its plan. Unless `full`, a consolidated branch is read only from the
    latest consolidation's last folded row on (from an older row folded in flight, or the
    running turn's user row, if earlier: the governor's checkpoints quote and fold those): the
    rows before it are never shown to the model, and on a long conversation reading and
    decoding them was most of a turn's start-up. The view, and the plan of every row read, are
    the same as from the whole branch."""
    compactions = folds.compactions(store, conversation_id)
    # Marks belong to compactions: none without one (most conversations, every turn).
    marks = folds.marks(store, conversation_id) if compactions else {}
    if not full:
        tail = _tail(store, conversation_id, compactions, marks)
        if tail is not None:
            return plan_for(tail, compactions, marks)
    return plan_for(after_separator(store.branch(conversation_id)), compactions, marks)


def _tail(
    store: Store,
    conversation_id: int,
    compactions: list[folds.Compaction],
    marks: dict[int, list[tuple[int, str]]],
) -> list[StoredMessage] | None:
    """The rows `plan_for` needs of a consolidated branch, after the last /new; None when the
    whole branch is needed (no consolidation, or the latest one is not on this branch).

    plan_for makes the last consolidation (in record order) whose last row is on the branch the
    active one: when the latest one's row is read, that is this one; a /new after it leaves
    the same rows as the whole branch does, and one before it leaves rows that are never
    compacted nor shown."""
    latest = next((c for c in reversed(compactions) if c.is_consolidation), None)
    if latest is None or latest.last_row_id is None:
        return None
    in_flight = [mid for mid, found in marks.items() if any(m == "compacted" for _, m in found)]
    floor = min([latest.last_row_id, *in_flight, *_running_turn_row(store, conversation_id)])
    rows = store.branch_since(conversation_id, floor)
    if not any(r.id == latest.last_row_id for r in rows):
        return None
    return after_separator(rows)  # the same cut as the whole branch's: see the docstring


def _running_turn_row(store: Store, conversation_id: int) -> list[int]:
    """The user row of the conversation's turn in progress, if any: the governor folds the
    rows after it in flight, even when a consolidation in that turn (an overflow) went past
    it."""
    found = store.running_turn_message(conversation_id)
    return [] if found is None else [found]


async def load_branch_async(
    store: Store, conversation_id: int, *, full: bool = False
) -> BranchState:
    slow = full or store.is_long(conversation_id)
    return await store.call(load_branch, store, conversation_id, full=full, off_loop=slow)


def system_for(
    deps: HistoryDeps, agent: str, state: BranchState, conversation_id: int | None = None
) -> str:
    """The system prompt of the branch; `conversation_id` names the conversation when the
    branch may have no rows yet (a look at one before its first turn: its Memory section)."""
    if conversation_id is None and state.rows:
        conversation_id = state.rows[0].conversation_id
    inputs = deps.prompt_inputs(agent, conversation_id)
    archived = state.consolidation.summary if state.consolidation else ""
    inputs = dataclasses.replace(inputs, archived_summary=archived)
    return deps.prompts.build(inputs) if deps.prompts else build_system_prompt(inputs)


def view_of(
    deps: HistoryDeps, state: BranchState, extra: list[Message] | None = None
) -> list[Message]:
    return derive_view(state.rows, state.plan, deps.view_options(), extra or ())
