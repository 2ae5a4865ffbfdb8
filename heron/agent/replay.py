"""Replaying a recorded turn: the runner's loop again, with the model's replies and the tool
results served from the trace (heron/agent/replay_serve.py) and the context built the way the
engine builds it.

The engine's BUILD runs `prepare_turn` (a consolidation when the conversation outgrew its share
of the window, then the view and the governor) and RUN lets the governor derive every request's
view and compact in flight. A replay does the same on an in-memory copy of the store rewound to
the turn's start (the head at the turn's user message, the compactions made since removed, the
calibration and budget as recorded), so summary and checkpoint calls are made again, served
from the trace and compared like every other request. The store itself is never written.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from heron.agent.replay_serve import (
    ReplayReport,
    ReplaySetup,
    ReplayStop,
    rebuild_system,
    recorded_inputs,
    set_up,
    start_messages,
)
from heron.agent.runner import RunHooks, RunLimits, Runner
from heron.compaction import prepare_turn
from heron.compaction import records as rec
from heron.compaction.consolidate import FAILED_TURNS_BEFORE_FALLBACK
from heron.compaction.core import CompactionSetup
from heron.config import AgentDefaults, Config
from heron.context.prompt import PromptInputs
from heron.context.tokens import Calibration
from heron.messages import Message
from heron.providers.base import RetryPolicy
from heron.providers.profiles import ModelChoice
from heron.store import Store
from heron.store import compactions as folds
from heron.tools.approval import describe_commands
from heron.tools.context import ToolContext
from heron.tools.python_kernel import KERNEL_IDLE_MINUTES, describe_kernel
from heron.tools.registry import Tool, ToolRegistry
from heron.tools.sandbox import Sandbox
from heron.trace.read import RunTrace


async def replay(
    store: Store,
    run_id: str,
    *,
    registry: ToolRegistry | None = None,
    live_tools: bool = False,
    workspace: Path | None = None,
    recorded_tools: bool = False,
) -> ReplayReport:
    """Replay one recorded run (see the module docstring) and report how its requests differ.
    `recorded_tools`: send the tools as the run described them, not as this code does.
    `live_tools`: run the tools again in `workspace` as given (the CLI gives a copy of the
    person's, heron/agent/replay_workspace.py), else in an empty temporary folder."""
    tools = registry or engine_registry()
    setup = await store.call(
        set_up, store, run_id, tools, live_tools, recorded_tools, off_loop=True
    )
    report = setup.report
    limits = RunLimits.recorded(setup.start.get("limits", {}))
    runner = Runner(setup.provider, setup.tools, setup.profile, limits, RetryPolicy(attempts=1))  # type: ignore[arg-type]
    copy = await store.call(rewound_copy, store, setup.run, off_loop=True)
    try:
        with tempfile.TemporaryDirectory(prefix="heron-replay-") as scratch:
            ctx = ToolContext(workspace=workspace or Path(scratch))
            try:
                system, messages, hooks = await _context(copy, setup)
                result = await runner.run(system, messages, ctx, hooks)
                report.replayed_stop = result.stop
            except ReplayStop as stop:
                report.replayed_stop = "interrupted" if "interrupted" in str(stop) else "error"
            finally:
                await ctx.aclose()
    finally:
        copy.close()
    return report


def engine_registry(attached: Iterable[Tool] = ()) -> ToolRegistry:
    """The tools an engine opens with (`engine_tools`), then `attached`, the ones the layers
    above add to it in the order they add them (heron/proactive/wiring.py: `spawn`,
    `ask_user`, `goal`, which this layer may not import): their current specs go in the
    replayed requests, so a changed tool shows."""
    from heron.agent.engine import engine_tools

    registry = engine_tools()
    for extra in attached:
        if registry.get(extra.name) is None:
            registry.add(extra)
    # Described as a long-lived process with the default settings describes them (a run
    # recorded unconfined, or by a one-shot `heron run`, shows as changed).
    describe_kernel(registry, KERNEL_IDLE_MINUTES, one_shot=False)
    describe_commands(registry, Sandbox(Path(".")))
    return registry


def rewound_copy(store: Store, run: RunTrace) -> Store:
    """An in-memory copy of the store as the turn found it: the conversation's head at the
    turn's user message, the compactions made from the turn on removed (their marks go with
    them), and the failed summaries in a row the turn found (at the third a consolidation
    writes its fallback)."""
    turn = run.turn
    head = (run.start or {}).get("user_message_id") or turn.user_message_id
    copy = store.rewound_copy(turn.conversation_id, head, turn.started)
    now = rec.context_state(copy, turn.conversation_id)
    failed, last = failures_found(store, run)
    found = dataclasses.replace(now, failed_turns=failed, last_failed_turn=last)
    rec.set_context_state(copy, turn.conversation_id, found)
    return copy


def failures_found(store: Store, run: RunTrace) -> tuple[int, int | None]:
    """The failed summaries in a row (and the last failing turn) the turn found, as its start
    recorded them. A run recorded before the start kept them: two when the turn's
    consolidation wrote the fallback, else none (the count decides nothing else)."""
    found = ((run.start or {}).get("context") or {}).get("failed_turns")
    if isinstance(found, list) and len(found) == 2:
        return int(found[0]), None if found[1] is None else int(found[1])
    turn = run.turn
    ended = turn.ended if turn.ended is not None else float("inf")
    fell_back = any(
        c.kind == "fallback" and turn.started <= c.created <= ended
        for c in folds.compactions(store, turn.conversation_id)
    )
    return (FAILED_TURNS_BEFORE_FALLBACK - 1 if fell_back else 0), None


class _ReplayEngine:
    """What compaction reads of an engine (heron.compaction.core.deps_for), as recorded."""

    def __init__(self, store: Store, setup: ReplaySetup) -> None:
        start, context = setup.start, setup.start["context"]
        self.store = store
        self.provider = setup.provider
        self.registry = setup.tools
        self.choice = ModelChoice(start["provider"], start["model"], profile=setup.profile)
        self.inputs = recorded_inputs(start)
        workspace = self.inputs.workspace if self.inputs else Path(".")
        agent = AgentDefaults(
            result_budget=context.get("result_cap", AgentDefaults.result_budget),
            consolidation_ratio=context.get("ratio", AgentDefaults.consolidation_ratio),
        )
        self.agent_defaults, self.workspace = agent, workspace
        factor, samples = context.get("calibration", (1.0, 0))
        rec.save_calibration(store, start["model"], Calibration(factor, samples), 0)

    def compaction_setup(self) -> CompactionSetup:
        return CompactionSetup(
            self.store,
            self.provider,
            self.choice.model,
            self.choice.profile,
            self.agent_defaults,
            Config().context,
            self.workspace,
            self.registry.specs,
            self.prompt_inputs,
            before_fold=self.memory_before_fold,
        )

    async def memory_before_fold(
        self, deps: object, conversation_id: int, row_ids: list[int], reason: str
    ) -> str | None:
        """Memory's extraction pass reads and writes the memory files: it is not run again;
        its recorded call is passed over so the calls after it line up."""
        self.provider.pass_over("memory")
        return None

    def prompt_inputs(self, agent: str, conversation_id: int | None = None) -> PromptInputs:
        if self.inputs is not None:
            return self.inputs
        return PromptInputs(agent, self.workspace, self.registry.specs())


async def _context(copy: Store, setup: ReplaySetup) -> tuple[str, list[Message], RunHooks]:
    """The system prompt, the start view and the run hooks, built as the engine builds them."""
    start, run, report = setup.start, setup.run, setup.report
    hooks = RunHooks(drain=setup.drain, should_break=setup.should_break)
    if not start.get("context"):  # recorded without a governor: the recorded view as it was
        messages = await copy.call(start_messages, copy, run, off_loop=True)
        return rebuild_system(start), messages, hooks
    engine = await copy.call(_ReplayEngine, copy, setup, off_loop=True)
    turn = run.turn
    conversation = await copy.call(copy.conversation_by_id, turn.conversation_id)
    anchor = start.get("user_message_id") or turn.user_message_id
    assert anchor is not None, "a recorded turn starts from its user message"
    prepared = await prepare_turn(
        engine, conversation, start["agent"], turn.id, anchor, window=start["context"]["window"]
    )
    if len(prepared.messages) != start.get("start_messages", len(prepared.messages)):
        report.notes.append(
            f"the run started from {start['start_messages']} messages; "
            f"the replay starts from {len(prepared.messages)}"
        )

    async def persist(message: Message) -> None:  # the governor reads the record back
        await copy.call(_write, copy, conversation.id, message, turn.id)

    hooks.on_message = persist
    hooks.govern = prepared.governor.govern
    hooks.on_model_call = prepared.governor.observing(_nothing)
    system = prepared.system if engine.inputs is not None else str(start["system"])
    return system, prepared.messages, hooks


def _write(copy: Store, conversation_id: int, message: Message, turn_id: int) -> None:
    """The run's next row: the one the recorded run wrote there, with its id, while the replay
    writes what the run wrote (the view quotes rows by id: a checkpoint's mail, a long
    message); a new row from the first difference on."""
    if copy.follow(conversation_id, message, turn_id) is None:
        copy.append(conversation_id, message, turn_id=turn_id, meta=message.meta)


async def _nothing(_: Any) -> None:
    return None
