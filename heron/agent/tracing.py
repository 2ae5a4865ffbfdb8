"""The recorder of one engine turn, set up from what the engine holds: the run's start (system
prompt, the inputs that rebuild it, profile, limits, the view's budgets) and the scrubber of
every credential in reach.

Here in the engine's layer, which knows the engine and the prompt, so that heron/trace/ only
records what it is given.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

from heron.context.prompt import PromptInputs, build_system_prompt
from heron.messages import JSONObject
from heron.providers.fenced import FencedTools
from heron.providers.wire import EncodedDict
from heron.trace.recorder import (
    Inputs,
    RunStart,
    TraceFixed,
    TraceRecorder,
    fingerprints,
    inputs_json,
    plain_fields,
)
from heron.trace.scrub import scrubber_for

if TYPE_CHECKING:
    from heron.agent.deps import TurnDeps
    from heron.compaction.governor import Governor
    from heron.messages import Message


class Built(Protocol):
    """What a trace reads of BUILD's result (heron/agent/turn.py's BuiltTurn)."""

    @property
    def turn_id(self) -> int: ...
    @property
    def system(self) -> str: ...
    @property
    def messages(self) -> list[Message]: ...
    @property
    def governor(self) -> Governor | None: ...


def prompt_inputs_for(engine: TurnDeps, built: Built, agent: str) -> PromptInputs | None:
    """The PromptInputs that produced `built.system`: the engine's prompt memo's when it built
    this very prompt, else built again with the workspace files frozen. None when they do not
    rebuild the recorded prompt (a replay then takes the recorded prompt as it was)."""
    made = engine.memos.prompts.built(built.system)
    if made is not None:  # the engine built this very prompt from these inputs
        return made.inputs
    workspace = engine.settings.paths.workspace
    specs = engine.registry.specs()
    files = engine.memos.bootstrap.read(workspace)  # the engine's, re-read on change
    inputs = PromptInputs(agent, workspace, specs, bootstrap=files, written=files.written)
    state = built.governor.state if built.governor is not None else None
    if state is not None and state.consolidation is not None:  # the archived summary
        inputs = dataclasses.replace(inputs, archived_summary=state.consolidation.summary)
    try:
        same = build_system_prompt(inputs) == built.system
    except Exception:  # a prompt builder that cannot run again is not replayable
        same = False
    return inputs if same else None


def _context(built: Built) -> JSONObject:
    governor = built.governor
    if governor is None:
        return {}
    cal, budget, found = governor.deps.calibration, governor.deps.budget, governor.deps.found
    return {
        "window": budget.window,
        "ratio": budget.ratio,
        "result_cap": budget.result_cap,
        "calibration": [cal.factor, cal.samples],
        # The failed summaries in a row the turn found (the third writes the fallback).
        **({"failed_turns": [found.failed_turns, found.last_failed_turn]} if found else {}),
    }


def trace_for(engine: TurnDeps, built: Built, agent: str = "default") -> TraceRecorder:
    """The recorder of one engine turn: what BUILD produced, the wire, and every credential in
    reach (to scrub)."""
    provider = engine.provider

    def inputs() -> Inputs | None:
        made = engine.memos.prompts.built(built.system)
        if made is not None:  # encoded once per prompt, not once per turn
            if "trace" not in made.derived:
                data = plain_fields(made.inputs)
                prints = fingerprints(dataclasses.replace(start, prompt_inputs=data))
                made.derived["trace"] = (data, inputs_json(data), prints)
            kept: Inputs = made.derived["trace"]
            return kept
        found = prompt_inputs_for(engine, built, agent)
        return None if found is None else plain_fields(found)

    fixed = engine_fixed(engine)
    start = RunStart(
        agent=agent,
        provider=provider.name,
        model=provider.model,
        system=built.system,
        profile=fixed.profile,
        limits=fixed.limits,
        start_messages=len(built.messages),
        fenced=isinstance(provider, FencedTools),
        context=_context(built),
    )
    messages = list(built.messages)
    return TraceRecorder(engine.store, built.turn_id, start, fixed.scrubber, messages, inputs)


def engine_fixed(engine: TurnDeps) -> TraceFixed:
    """The engine's TraceFixed, made on its first turn."""
    if engine.memos.trace is None:
        settings = engine.settings
        engine.memos.trace = TraceFixed(
            EncodedDict.of(plain_fields(engine.choice.profile)),
            EncodedDict.of(plain_fields(engine.limits)),
            scrubber_for(settings.env, settings.config.api_keys, engine.choice.api_key),
        )
    return engine.memos.trace
