"""What compaction needs from the engine, the budgets it works to, and the view of a branch.

`ContextDeps` is built from an engine (duck-typed: compaction never imports the engine), so the
functions here run in a turn, from `/compact`, from an overflow, or from the idle sweeper.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heron.compaction import records as rec
from heron.config import ContextShares
from heron.context.budget import too_large
from heron.context.prompt import PromptInputs, PromptMemo, build_system_prompt
from heron.context.tokens import Calibration, estimate_request, estimate_tools
from heron.context.view import ViewOptions, ViewPlan, derive_view
from heron.messages import Message, Reply, dumps
from heron.providers.base import ChatRequest, Provider, ToolSpec
from heron.providers.wire import ModelCallRecord
from heron.store import Store
from heron.store.records import StoredMessage

KEEP_MESSAGES = 8  # a consolidation leaves at least the last 8 messages verbatim


@dataclass(frozen=True)
class Budget:
    """Token budgets from the model's window: each part of a request a share of it
    (`[context]` in config.toml, heron.config.ContextShares)."""

    window: int
    output: int  # the output expected of a call, reserved in the window
    ratio: float = 0.5  # consolidate when the conversation passes window x ratio
    result_cap: int = 20_000  # the configured per-result budget, in characters
    shares: ContextShares = ContextShares()

    @property
    def input(self) -> int:
        return max(1, self.window - self.output)

    @property
    def consolidate_at(self) -> int:
        return int(self.window * self.ratio)

    def trigger(self, fixed: int) -> int:
        """The conversation size (view plus archive) that starts a consolidation, with `fixed`
        tokens of system prompt and tools: window x ratio, lower when the request would
        otherwise not fit (a tenth of the room kept for the estimate's error)."""
        room = (self.input - fixed) * 9 // 10
        # No room at all: the system prompt and tools alone are too large, which folding the
        # history cannot fix (the request is refused with what to do instead).
        return min(self.consolidate_at, room) if room > 0 else self.consolidate_at

    def share(self, name: str) -> int:
        """The tokens of one share of the window (a field of ContextShares)."""
        return max(1, int(self.window * getattr(self.shares, name)))

    @property
    def result_chars(self) -> int:
        """Per-result budget in the view: small windows get smaller results, so the 5 to 14
        results kept intact by micro-compaction still fit."""
        return max(500, min(self.result_cap, self.share("tool_result") * 4))

    @property
    def recall_chars(self) -> int:
        return max(500, min(self.result_cap, self.share("recall") * 4))

    @property
    def user_chars(self) -> int:
        return max(2_000, self.share("user_message") * 4)

    def lines(self) -> list[tuple[str, int]]:
        """(what, tokens) of every budget, for /status and `conversations show --budget`."""
        names = [
            ("system prompt with memory", "system"),
            ("  memory", "memory"),
            ("archived context", "archive"),
            ("  the user's verbatim words in it", "user_words"),
            ("recent turns kept whole", "recent"),
            ("one tool result", "tool_result"),
            ("one recall result", "recall"),
            ("one user message", "user_message"),
        ]
        return [
            ("window", self.window),
            ("output reserve", self.output),
            *((label, self.share(name)) for label, name in names),
        ]


def budget_for(
    window: int,
    max_output: int,
    ratio: float,
    result_cap: int,
    shares: ContextShares | None = None,
) -> Budget:
    output = min(max_output, max(256, window // 4))
    return Budget(window, output, ratio, result_cap, shares or ContextShares())


@dataclass
class ContextDeps:
    store: Store
    provider: Provider
    model: str
    budget: Budget
    workspace: Path
    tools: list[ToolSpec]
    # (agent, conversation id) -> the inputs before compaction (the memory sections need the id)
    prompt_inputs: Callable[[str, int | None], PromptInputs]
    calibration: Calibration = Calibration()
    idle_minutes: int = 15
    # The turn's recorder of compaction's own model calls (trace and usage); None: unrecorded.
    on_call: Callable[[ModelCallRecord], Awaitable[None]] | None = None
    tools_estimate: int | None = None  # raw estimate of `tools`, see tools_raw()
    # Memory (heron/memory): the extraction pass before a fold (conversation id, the row ids
    # folded, the reason) and the thaw of the frozen Memory section after it.
    before_fold: Callable[[ContextDeps, int, list[int], str], Awaitable[None]] | None = None
    after_fold: Callable[[int], Awaitable[None]] | None = None
    prompts: PromptMemo | None = None  # the engine's built prompts, remembered

    def view_options(self) -> ViewOptions:
        b = self.budget
        return ViewOptions(b.result_chars, self.workspace, b.user_chars, b.recall_chars)

    def tools_raw(self) -> int:
        """The raw token estimate of the tool schemas: a JSON encoding of every schema, so it
        is worked out once per deps instead of before every estimate."""
        if self.tools_estimate is None:
            self.tools_estimate = estimate_tools(self.tools)
        return self.tools_estimate

    async def chat(self, request: ChatRequest, purpose: str) -> Reply:
        """A compaction model call (`purpose`: summary | checkpoint), handed to `on_call` with
        its exact payload so the turn's trace holds it and the turn pays for it. A request
        over the window is not sent (the hard invariant): RequestTooLarge, which a summary
        treats as any failure of the summarizer."""
        est = estimate_request(request.system, request.tools, request.messages, self.calibration)
        if est.total > self.budget.input:
            parts = {
                "system prompt": est.system,
                "tool schemas": est.tools,
                "messages": est.messages,
            }
            raise too_large(parts, self.budget.window, self.budget.output)
        if self.on_call is None:
            return await self.provider.chat(request)
        payload = dumps(self.provider.payload(request))
        started = time.time()
        try:
            reply = await self.provider.chat(request)
        except Exception as e:
            failed = ModelCallRecord(0, purpose, payload, None, repr(e), started, time.time())
            await self.on_call(failed)
            raise
        await self.on_call(ModelCallRecord(0, purpose, payload, reply, None, started, time.time()))
        return reply


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
        engine.settings.config.context,
    )
    cal, _ = rec.calibration(engine.store, engine.choice.model)

    def inputs(name: str, conversation_id: int | None = None) -> PromptInputs:
        base = getattr(engine, "prompt_inputs", None)
        if callable(base):
            return base(name, conversation_id)
        workspace = engine.settings.paths.workspace
        cache = getattr(engine, "bootstrap_cache", None)
        files = cache.read(workspace) if cache is not None else {}
        return PromptInputs(name, workspace, engine.registry.specs(), bootstrap=files)

    deps = ContextDeps(
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
    deps.before_fold = getattr(engine, "memory_before_fold", None)
    deps.after_fold = getattr(engine, "memory_after_fold", None)
    deps.prompts = getattr(engine, "prompt_memo", None)
    return deps


# ---- the plan of a branch --------------------------------------------------------------------


@dataclass(frozen=True)
class BranchState:
    # The branch after the last /new separator; when a consolidation is active and the state
    # was not loaded `full`, only from its last folded row (or an older row folded in flight)
    # on: what the view and the plan of the rows after the fold depend on. See load_branch.
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


def load_branch(store: Store, conversation_id: int, *, full: bool = False) -> BranchState:
    """The branch and its plan. Unless `full`, a consolidated branch is read only from the
    latest consolidation's last folded row on (from an older row folded in flight, or the
    running turn's user row, if earlier: the governor's checkpoints quote and fold those): the
    rows before it are never shown to the model, and on a long conversation reading and
    decoding them was most of a turn's start-up. The view, and the plan of every row read, are
    the same as from the whole branch."""
    compactions = rec.compactions(store, conversation_id)
    # Marks belong to compactions: none without one (most conversations, every turn).
    marks = rec.marks(store, conversation_id) if compactions else {}
    if not full:
        tail = _tail(store, conversation_id, compactions, marks)
        if tail is not None:
            return plan_for(tail, compactions, marks)
    return plan_for(after_separator(store.branch(conversation_id)), compactions, marks)


def _tail(
    store: Store,
    conversation_id: int,
    compactions: list[rec.Compaction],
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
    rows = store.query(
        "SELECT user_message_id, status FROM turns WHERE conversation_id = ?"
        " ORDER BY id DESC LIMIT 1",
        (conversation_id,),
    )
    if rows and rows[0][1] == "running" and rows[0][0] is not None:
        return [int(rows[0][0])]
    return []


async def load_branch_async(
    store: Store, conversation_id: int, *, full: bool = False
) -> BranchState:
    slow = full or store.is_long(conversation_id)
    return await store.call(load_branch, store, conversation_id, full=full, off_loop=slow)


def system_for(deps: ContextDeps, agent: str, state: BranchState) -> str:
    inputs = deps.prompt_inputs(agent, state.rows[0].conversation_id if state.rows else None)
    archived = state.consolidation.summary if state.consolidation else ""
    inputs = dataclasses.replace(inputs, archived_summary=archived)
    return deps.prompts.build(inputs) if deps.prompts else build_system_prompt(inputs)


def view_of(
    deps: ContextDeps, state: BranchState, extra: list[Message] | None = None
) -> list[Message]:
    return derive_view(state.rows, state.plan, deps.view_options(), extra or ())


def tokens_of(deps: ContextDeps, system: str, messages: list[Message]) -> int:
    cal = deps.calibration
    return estimate_request(system, [], messages, cal).total + cal.tokens(deps.tools_raw())
