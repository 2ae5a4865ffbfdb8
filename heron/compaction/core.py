"""What compaction needs from the engine and the budgets it works to (the view of a branch it
folds is heron/context/history.py).

`ContextDeps` is built from a `CompactionSetup` that the engine hands over (compaction never
imports the engine), so the functions here run in a turn, from `/compact`, from an overflow,
or from the idle sweeper.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeAlias

from heron.compaction import records as rec
from heron.config import AgentDefaults, ContextShares
from heron.context.budget import too_large
from heron.context.prompt import PromptInputs, PromptMemo
from heron.context.tokens import Calibration, estimate_request, estimate_tools
from heron.context.view import ViewOptions
from heron.messages import Message, Reply
from heron.providers.base import Provider
from heron.providers.profiles import ModelProfile
from heron.providers.wire import ModelCallRecord, call_recorded
from heron.request import ChatRequest, ToolSpec
from heron.store import Store


class RunSink(Protocol):
    """A run of its own for calls made outside any turn (heron/agent/maintenance.py): takes
    each call as `ContextDeps.on_call` does, and is told when the operation failed."""

    async def __call__(self, record: ModelCallRecord) -> None: ...

    def fail(self, reason: str) -> None: ...


# (conversation id, kind) -> the run, open while the block runs.
Maintenance: TypeAlias = Callable[[int, str], AbstractAsyncContextManager[RunSink]]

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

    def share(self, fraction: float) -> int:
        """The tokens of one share of the window (a field of ContextShares)."""
        return max(1, int(self.window * fraction))

    @property
    def result_chars(self) -> int:
        """Per-result budget in the view: small windows get smaller results, so the 5 to 14
        results kept intact by micro-compaction still fit."""
        return max(500, min(self.result_cap, self.share(self.shares.tool_result) * 4))

    @property
    def recall_chars(self) -> int:
        return max(500, min(self.result_cap, self.share(self.shares.recall) * 4))

    @property
    def user_chars(self) -> int:
        return max(2_000, self.share(self.shares.user_message) * 4)

    def lines(self) -> list[tuple[str, int]]:
        """(what, tokens) of every budget, for /status and `conversations show --budget`."""
        shares = self.shares
        parts = [
            ("system prompt with memory", shares.system),
            ("  memory", shares.memory),
            ("archived context", shares.archive),
            ("  the user's verbatim words in it", shares.user_words),
            ("recent turns kept whole", shares.recent),
            ("one tool result", shares.tool_result),
            ("one recall result", shares.recall),
            ("one user message", shares.user_message),
        ]
        return [
            ("window", self.window),
            ("output reserve", self.output),
            *((label, self.share(fraction)) for label, fraction in parts),
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
    # False for a tiny model (its profile's brief_prompt): consolidation writes its facts
    # without the model (a 135M model's summary is slow and unreliable, and its brief prompt
    # carries the person's quoted words, not the summary), and memory's pass (`before_fold`)
    # is not run either.
    model_summary: bool = True
    # Memory (heron/memory): the extraction pass before a fold (conversation id, the row ids
    # folded, the reason; it answers what the person is told when it did not run) and the
    # thaw of the frozen Memory section after it.
    before_fold: Callable[[ContextDeps, int, list[int], str], Awaitable[str | None]] | None = None
    after_fold: Callable[[int], Awaitable[None]] | None = None
    prompts: PromptMemo | None = None  # the engine's built prompts, remembered
    # The compaction state a turn found before it consolidated (its failed summaries in a
    # row): the turn's trace records it, so a replay falls back where the turn did.
    found: rec.ContextState | None = None
    maintenance: Maintenance | None = None  # see CompactionSetup
    # Idle compaction's wait for the person between a consolidation's phases (its prompt made,
    # the summary written, memory's pass done): False when the conversation moved on meanwhile,
    # and the consolidation stops there, changing nothing (heron/compaction/idle.py).
    between: Callable[[int], Awaitable[bool]] | None = None

    def view_options(self) -> ViewOptions:
        b = self.budget
        read = self.store.files.read
        return ViewOptions(b.result_chars, self.workspace, b.user_chars, b.recall_chars, read)

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
        return await call_recorded(self.provider, request, purpose, self.on_call)


@dataclass
class CompactionSetup:
    """What compaction reads of the process it runs in: the engine builds one
    (`Engine.compaction_setup`), and so does a replay from what a trace recorded."""

    store: Store
    provider: Provider
    model: str
    profile: ModelProfile
    agent: AgentDefaults  # [agent]: the consolidation ratio, result budget, idle minutes
    context: ContextShares  # [context]: the window's shares
    workspace: Path
    specs: Callable[[], list[ToolSpec]]  # the tool schemas a request carries
    # (agent, conversation id) -> the inputs before compaction (the memory sections need the id)
    prompt_inputs: Callable[[str, int | None], PromptInputs]
    forced_window: str = ""  # HERON_CONTEXT_WINDOW, when set
    # Memory (heron/memory): the extraction pass before a fold and the thaw after it.
    before_fold: Callable[[ContextDeps, int, list[int], str], Awaitable[str | None]] | None = None
    after_fold: Callable[[int], Awaitable[None]] | None = None
    prompts: PromptMemo | None = None  # the engine's built prompts, remembered
    # A maintenance run (conversation id, kind) for calls made outside any turn (the idle
    # sweeper's): the engine's, recording them (heron/agent/maintenance.py); None: unrecorded.
    maintenance: Maintenance | None = None


class CompactionHost(Protocol):
    """An engine, as compaction sees it (compaction never imports the engine)."""

    def compaction_setup(self) -> CompactionSetup: ...


def window_for(host: CompactionHost | CompactionSetup, window: int | None = None) -> int:
    """The window in tokens: an explicit one, HERON_CONTEXT_WINDOW, then the model profile."""
    if window:
        return window
    setup = host if isinstance(host, CompactionSetup) else host.compaction_setup()
    if setup.forced_window.isdigit():
        return int(setup.forced_window)
    return int(setup.profile.context_window)


def deps_for(host: CompactionHost, window: int | None = None) -> ContextDeps:
    """The compaction dependencies of an engine."""
    setup = host.compaction_setup()
    agent = setup.agent
    budget = budget_for(
        window_for(setup, window),
        setup.profile.max_output,
        agent.consolidation_ratio,
        agent.result_budget,
        setup.context,
    )
    cal, _ = rec.calibration(setup.store, setup.model)
    deps = ContextDeps(
        setup.store,
        setup.provider,
        setup.model,
        budget,
        setup.workspace,
        setup.specs(),
        setup.prompt_inputs,
        cal,
        agent.idle_compact_after_minutes,
    )
    deps.before_fold, deps.after_fold = setup.before_fold, setup.after_fold
    deps.prompts, deps.maintenance = setup.prompts, setup.maintenance
    deps.model_summary = not setup.profile.brief_prompt
    return deps


def tokens_of(deps: ContextDeps, system: str, messages: list[Message]) -> int:
    cal = deps.calibration
    return estimate_request(system, [], messages, cal).total + cal.tokens(deps.tools_raw())
