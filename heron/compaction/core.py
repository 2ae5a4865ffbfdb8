"""What compaction needs from the engine, the budgets it works to, and the view of a branch.

`ContextDeps` is built from an engine (duck-typed: compaction never imports the engine), so the
functions here run in a turn, from `/compact`, from an overflow, or from the idle sweeper.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heron.compaction import records as rec
from heron.context.prompt import PromptInputs, build_system_prompt
from heron.context.tokens import Calibration, estimate_request
from heron.context.view import ViewOptions, ViewPlan, derive_view
from heron.messages import Message
from heron.providers.base import Provider, ToolSpec
from heron.store import Store
from heron.store.records import StoredMessage

KEEP_MESSAGES = 8  # a consolidation leaves at least the last 8 messages verbatim


@dataclass(frozen=True)
class Budget:
    """Token budgets from the model's window."""

    window: int
    output: int  # the output expected of a call, reserved in the window
    ratio: float = 0.5  # consolidate when the conversation passes window x ratio
    result_cap: int = 20_000  # the configured per-result budget, in characters

    @property
    def input(self) -> int:
        return max(1, self.window - self.output)

    @property
    def consolidate_at(self) -> int:
        return int(self.window * self.ratio)

    @property
    def result_chars(self) -> int:
        """Per-result budget in the view: small windows get smaller results, so the 5 to 14
        results kept intact by micro-compaction still fit."""
        return max(500, min(self.result_cap, self.input * 4 // 30))


def budget_for(window: int, max_output: int, ratio: float, result_cap: int) -> Budget:
    return Budget(window, min(max_output, max(256, window // 4)), ratio, result_cap)


@dataclass
class ContextDeps:
    store: Store
    provider: Provider
    model: str
    budget: Budget
    workspace: Path
    tools: list[ToolSpec]
    prompt_inputs: Callable[[str], PromptInputs]  # agent -> the inputs before compaction
    calibration: Calibration = Calibration()
    idle_minutes: int = 15

    def view_options(self) -> ViewOptions:
        return ViewOptions(self.budget.result_chars, self.workspace)


def window_for(engine: Any, window: int | None = None) -> int:
    """The window in tokens: an explicit one, HERON_CONTEXT_WINDOW, then the model profile."""
    if window:
        return window
    forced = str(engine.settings.env.get("HERON_CONTEXT_WINDOW") or "")
    if forced.isdigit():
        return int(forced)
    return int(engine.choice.profile.context_window)


def deps_for(engine: Any, window: int | None = None) -> ContextDeps:
    """The compaction dependencies of an `Engine`."""
    agent = engine.settings.config.agent
    profile = engine.choice.profile
    budget = budget_for(
        window_for(engine, window),
        profile.max_output,
        agent.consolidation_ratio,
        agent.result_budget,
    )
    cal, _ = rec.calibration(engine.store, engine.choice.model)

    def inputs(name: str) -> PromptInputs:
        base = getattr(engine, "prompt_inputs", None)
        if callable(base):
            return base(name)
        return PromptInputs(name, engine.settings.paths.workspace, engine.registry.specs())

    return ContextDeps(
        engine.store,
        engine.provider,
        engine.choice.model,
        budget,
        engine.settings.paths.workspace,
        engine.registry.specs(),
        inputs,
        cal,
        agent.idle_compact_after_minutes,
    )


# ---- the plan of a branch --------------------------------------------------------------------


@dataclass(frozen=True)
class BranchState:
    rows: list[StoredMessage]
    plan: ViewPlan
    consolidation: rec.Compaction | None  # the active one: its last row is in the branch


def plan_for(
    rows: list[StoredMessage],
    compactions: list[rec.Compaction],
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


def load_branch(store: Store, conversation_id: int) -> BranchState:
    rows = after_separator(store.branch(conversation_id))
    return plan_for(
        rows, rec.compactions(store, conversation_id), rec.marks(store, conversation_id)
    )


async def load_branch_async(store: Store, conversation_id: int) -> BranchState:
    return await asyncio.to_thread(load_branch, store, conversation_id)


def system_for(deps: ContextDeps, agent: str, state: BranchState) -> str:
    inputs = deps.prompt_inputs(agent)
    archived = state.consolidation.summary if state.consolidation else ""
    return build_system_prompt(dataclasses.replace(inputs, archived_summary=archived))


def view_of(
    deps: ContextDeps, state: BranchState, extra: list[Message] | None = None
) -> list[Message]:
    return derive_view(state.rows, state.plan, deps.view_options(), extra or ())


def tokens_of(deps: ContextDeps, system: str, messages: list[Message]) -> int:
    return estimate_request(system, deps.tools, messages, deps.calibration).total
