"""Deterministic replay, what is served back: a run's recorded replies, tool results, mailbox
and start, given to the loop that heron/agent/replay.py runs again. It reads the trace
(heron/trace/read.py) and rebuilds the prompt and the tools, which is why it lives with the
agent rather than in heron/trace/, which only records and reads.

The loop starts from what the run started from (the system prompt rebuilt from its recorded
inputs with the current code, the view the compaction governor derives again), the
model's replies are served from the trace, tool results too (or, with `live_tools`, the tools run
again and differing results are reported), and recorded mailbox injections and breaks happen at
the same points. Every request the loop builds is compared with the recorded one; the first
difference is reported by request, message, part and field.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heron.context.prompt import PromptInputs, build_system_prompt
from heron.errors import FatalProviderError, StoreError
from heron.messages import (
    JSONObject,
    Message,
    Reply,
    ToolCall,
    ToolResult,
    dumps,
    message_from_dict,
)
from heron.providers.profiles import ModelProfile, profile_for
from heron.providers.wire import STOPPED
from heron.request import ChatRequest, OnEvent, ToolSpec
from heron.store import Store
from heron.tools.builtin import default_registry
from heron.tools.context import ToolContext, recording
from heron.tools.memory_tools import MEMORY_TOOLS
from heron.tools.python_kernel import describe_kernel, lifetime_in, run_cell, session_as_recorded
from heron.tools.registry import OnStart, ToolRegistry
from heron.trace.diff import Difference, first_difference
from heron.trace.read import RunTrace, ToolTrace, later_runs, load_run, request_payload

PayloadFn = Callable[[ChatRequest], JSONObject]


class ReplayStop(Exception):
    """The replayed run reached the point where the recorded one ended (or went past it)."""


@dataclass
class ToolDifference:
    call_id: str
    name: str
    recorded: str | None
    now: str


@dataclass
class ReplayReport:
    run_id: str
    recorded_requests: int
    replayed_requests: int = 0
    first: tuple[int, Difference] | None = None  # (request number, from 1; the difference)
    differing_requests: int = 0
    tool_differences: list[ToolDifference] = field(default_factory=list)
    recorded_stop: str | None = None
    replayed_stop: str | None = None
    notes: list[str] = field(default_factory=list)
    # The recorded requests the replay cannot rebuild, and why (`retry_not_rebuilt`).
    not_rebuilt: NotRebuilt | None = None

    @property
    def checkable(self) -> int:
        """The recorded requests a replay can rebuild."""
        skipped = self.not_rebuilt.count if self.not_rebuilt else 0
        return self.recorded_requests - skipped

    @property
    def identical(self) -> bool:
        return (
            self.first is None
            and self.replayed_requests == self.recorded_requests
            and not self.tool_differences
        )

    @property
    def exit_status(self) -> int:
        """`heron trace replay`'s: 0 every request rebuilt and identical; 1 something differs
        (a request, a tool result, where the replay ended); 3 nothing rebuilt differs, but
        some recorded requests could not be rebuilt (said, with why)."""
        if self.first is not None or self.tool_differences:
            return 1
        if self.replayed_requests != self.checkable:
            return 1
        return 3 if self.not_rebuilt else 0

    def render(self) -> str:
        lines = [
            f"replay of {self.run_id}: {self.replayed_requests} of {self.recorded_requests} "
            f"requests rebuilt; stop {self.replayed_stop} (recorded {self.recorded_stop})"
        ]
        if self.first is None:
            lines.append(self._same())
        else:
            number, diff = self.first
            lines.append(
                f"first difference: request {number}, {diff.describe()}"
                f" ({self.differing_requests} request(s) differ)"
            )
        for t in self.tool_differences:
            lines.append(
                f"tool {t.name} [{t.call_id}] result differs: {_clip(t.recorded)} → {_clip(t.now)}"
            )
        if self.not_rebuilt is not None:
            lines.append(self.not_rebuilt.render())
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _same(self) -> str:
        """The line of a replay whose rebuilt requests are all identical."""
        if self.replayed_requests < self.checkable:
            return (
                f"the requests rebuilt are identical to the recorded ones, but the replay "
                f"ended after request {self.replayed_requests} where the run went on to "
                f"request {self.checkable}"
            )
        if self.not_rebuilt is not None:
            return "every request rebuilt is identical to the recorded one"
        return "every request is identical to the recorded one"


@dataclass(frozen=True)
class NotRebuilt:
    """Recorded requests `first` to `last` (numbered from 1) that a replay does not rebuild."""

    first: int
    last: int
    why: str

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def render(self) -> str:
        which = (
            f"request {self.first}"
            if self.first == self.last
            else f"requests {self.first}-{self.last}"
        )
        return f"{which} not rebuilt: {self.why}"


RETRY_WHY = (
    "they are the turn's run after its context overflow (request {overflow}), made from the "
    "conversation compacted and built again for a smaller window; the trace keeps the start "
    "of the turn's first run only, so a replay checks that run and stops at its overflow"
)


def retry_not_rebuilt(run: RunTrace) -> tuple[RunTrace, NotRebuilt | None]:
    """The turn's first run, and what a replay of it leaves out: the retry after a context
    overflow (heron/agent/turn.py), whose start the trace does not keep."""
    later = later_runs(run)
    if not later:
        return run, None
    first = [c for c in run.calls if c.attempt == 1]
    only = dataclasses.replace(
        run,
        calls=first,
        tools=[t for t in run.tools if t.attempt == 1],
        events=[e for e in run.events if e.attempt == 1],
    )
    why = RETRY_WHY.format(overflow=len(first))
    return only, NotRebuilt(len(first) + 1, len(run.calls), why)


def _clip(text: str | None, limit: int = 120) -> str:
    text = " ".join((text or "").split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


# ---- the wire -------------------------------------------------------------------------------


def payload_builder(start: dict[str, Any]) -> PayloadFn:
    """The payload function of the wire the run was recorded on (no network, no key)."""
    wire, model = start["provider"], start["model"]
    profile = _profile(start)
    fn: PayloadFn
    if wire == "scripted":
        from heron.providers.scripted import ScriptedProvider

        fn = ScriptedProvider([], model=model).payload
    elif wire in ("openai", "local"):
        from heron.providers.openai_compat import OpenAICompatProvider

        fn = OpenAICompatProvider(model, "replay", profile=profile).payload
    elif wire == "anthropic":
        from heron.providers.anthropic import build_payload

        fn = functools.partial(build_payload, profile=profile)
    else:
        raise StoreError(f"cannot rebuild requests for the {wire!r} wire")
    if start.get("fenced"):
        from heron.providers.fenced import FencedTools

        inner = fn

        class _Inner:
            name, model = wire, start["model"]
            payload = staticmethod(inner)

        fn = FencedTools(_Inner()).payload  # type: ignore[arg-type]
    return fn


def _profile(start: dict[str, Any]) -> ModelProfile:
    """The profile the run was recorded with; a field it predates (a trace older than the
    `vision` flag) is the model's profile today."""
    known = ModelProfile.__dataclass_fields__
    recorded = {k: v for k, v in start.get("profile", {}).items() if k in known}
    return dataclasses.replace(profile_for(str(start.get("model", ""))), **recorded)


class ReplayProvider:
    """Serves the recorded replies in order and checks each request against the recorded one."""

    def __init__(self, run: RunTrace, payloads: list[str], build: PayloadFn, report: ReplayReport):
        assert run.start is not None
        self.name = "replay"
        self.model = run.start["model"]
        self.run, self.payloads, self.build, self.report = run, payloads, build, report
        self.served = 0

    def payload(self, request: ChatRequest) -> JSONObject:
        return self.build(request)

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        index = self.served
        if index >= len(self.run.calls):
            if self.run.turn.status == "interrupted":
                raise ReplayStop("interrupted")
            self.report.notes.append(f"the replay made request {index + 1}, never recorded")
            raise ReplayStop("extra request")
        self.served += 1
        self.report.replayed_requests = self.served
        self._compare(index, dumps(self.build(request)))
        call = self.run.calls[index]
        if call.streamed is not None and call.error == STOPPED:  # stopped while it streamed
            raise ReplayStop("interrupted")
        if call.reply is None:
            raise FatalProviderError(call.error or "the recorded call failed")
        return call.reply

    def pass_over(self, purpose: str) -> int:
        """Serve the next recorded calls of `purpose` without a request (a pass the replay
        does not run again, such as memory's extraction), so the calls after them line up."""
        skipped = 0
        while self.served < len(self.run.calls) and self.run.calls[self.served].purpose == purpose:
            self.served += 1
            skipped += 1
        self.report.replayed_requests = self.served
        if skipped:
            self.report.notes.append(f"{skipped} recorded {purpose} call(s) not run again")
        return skipped

    def _compare(self, index: int, now: str) -> None:
        recorded = self.payloads[index]
        if now == recorded:
            return
        self.report.differing_requests += 1
        if self.report.first is None:
            diff = first_difference(json.loads(recorded), json.loads(now))
            if diff is not None:
                self.report.first = (index + 1, diff)

    async def aclose(self) -> None:
        return None


# Tools a live replay serves from the record: memory's read and write memory's files, the
# review queue and the history, none of them the replay's copy (heron/tools/memory_tools.py).
FROM_THE_RECORD = frozenset(t.name for t in MEMORY_TOOLS)


class ReplayTools:
    """The tool registry of a replay: the current tools' specs (so a changed tool shows in the
    request), results served from the trace, or the tools run again when `live` is true."""

    def __init__(
        self,
        run: RunTrace,
        registry: ToolRegistry,
        live: bool,
        report: ReplayReport,
        specs: list[ToolSpec] | None = None,
    ):
        self.registry, self.live, self.report = registry, live, report
        self._specs = specs  # the specs the run recorded, sent instead of the current ones
        self.interrupted = run.turn.status == "interrupted"
        self.served: list[str] = []  # memory tools a live replay served from the record
        self._note_at: int | None = None  # where the report's note names them
        self.recorded: dict[str, list[ToolTrace]] = {}
        for tool in run.tools:
            self.recorded.setdefault(tool.call_id, []).append(tool)

    def specs(self) -> list[ToolSpec]:
        return self.registry.specs() if self._specs is None else self._specs

    async def call_recording(
        self, call: ToolCall, ctx: ToolContext, on_start: OnStart | None = None
    ) -> tuple[ToolResult, list[JSONObject]]:
        """As `call`, with what the call did (nothing, when its result is served)."""
        return await recording(self.call(call, ctx, on_start))

    async def call(
        self, call: ToolCall, ctx: ToolContext, on_start: OnStart | None = None
    ) -> ToolResult:
        found = self.recorded.get(call.id, [])
        recorded = found.pop(0) if found else None
        stopped = recorded is not None and recorded.interrupted
        if stopped or (recorded is None and self.interrupted):
            # The run was stopped while this call ran (or before it): the replay stops here
            # too, and a live one never starts it again (an endless cell would not end).
            raise ReplayStop("interrupted during tools")
        served = call.name in FROM_THE_RECORD  # memory's: its files are not the replay's
        if self.live and not served:
            if call.name == run_cell.name and ctx.kernel is None:  # the run's first cell
                first = recorded.result if recorded is not None else None
                ctx.kernel = session_as_recorded(ctx.workspace, ctx.sandbox, first)
            result = await self.registry.call(call, ctx, on_start)
            if recorded is None or result.content != recorded.result:
                was = None if recorded is None else recorded.result
                self.report.tool_differences.append(
                    ToolDifference(call.id, call.name, was, result.content)
                )
            return result
        if recorded is None:
            self.report.notes.append(f"no recorded result for tool call {call.id} ({call.name})")
            return ToolResult(call.id, "Error: no recorded result", True)
        if self.live and served:
            self._served_from_record(call.name)
        return ToolResult(call.id, recorded.result or "", recorded.is_error)

    def _served_from_record(self, name: str) -> None:
        """Note, once for the replay, the memory tools a live replay served from the record."""
        if name in self.served:
            return
        self.served.append(name)
        note = (
            f"memory tools served from the record, not run again: {', '.join(self.served)} "
            "(they read and write memory's files and review queue, which a replay leaves "
            "alone, as it does the extraction pass)"
        )
        if self._note_at is None:
            self._note_at = len(self.report.notes)
            self.report.notes.append(note)
        else:
            self.report.notes[self._note_at] = note


# ---- the run's start --------------------------------------------------------------------------


def recorded_inputs(start: dict[str, Any]) -> PromptInputs | None:
    """The PromptInputs the run's system prompt was built from, if they were recorded."""
    inputs = start.get("prompt_inputs")
    if inputs is None:
        return None
    known = PromptInputs.__dataclass_fields__
    values = {k: v for k, v in inputs.items() if k in known}
    values["workspace"] = Path(values["workspace"])
    if values.get("tools") is not None:
        values["tools"] = [ToolSpec(**t) for t in values["tools"]]
    return PromptInputs(**values)


def rebuild_system(start: dict[str, Any]) -> str:
    """The system prompt from the recorded inputs with the current prompt code; the recorded
    prompt itself when the inputs were not recorded."""
    inputs = recorded_inputs(start)
    return str(start["system"]) if inputs is None else build_system_prompt(inputs)


def start_messages(store: Store, run: RunTrace) -> list[Message]:
    """The messages the run started from: the recorded view (summaries and runtime block
    included); for runs recorded without it, the conversation's branch up to the turn's user
    message as the model was sent it."""
    assert run.start is not None
    if run.start.get("messages") is not None:
        return [message_from_dict(m) for m in run.start["messages"]]
    head = run.start.get("user_message_id") or run.turn.user_message_id
    if head is None:
        raise StoreError(f"run {run.turn.run_id} has no user message to start from")
    return [m.wire for m in store.branch(run.turn.conversation_id, head)]


def _mailbox(
    run: RunTrace, provider: ReplayProvider
) -> tuple[Callable[[], Awaitable[list[Message]]], Callable[[], bool]]:
    injections = [e for e in run.events if e.kind == "injection"]
    breaks = [e for e in run.events if e.kind == "break"]

    async def drain() -> list[Message]:
        due = [e for e in injections if e.after_call <= provider.served]
        for e in due:
            injections.remove(e)
        return [message_from_dict(m) for e in due for m in e.body]

    def should_break() -> bool:
        due = [e for e in breaks if e.after_call <= provider.served]
        if due:
            breaks.remove(due[0])
        return bool(due)

    return drain, should_break


# ---- one replay's pieces ----------------------------------------------------------------------


@dataclass
class ReplaySetup:
    """What a replay of one run needs from its trace; the agent layer runs the loop."""

    run: RunTrace
    start: dict[str, Any]
    report: ReplayReport
    provider: ReplayProvider
    tools: ReplayTools
    drain: Callable[[], Awaitable[list[Message]]]
    should_break: Callable[[], bool]

    @property
    def profile(self) -> ModelProfile:
        return _profile(self.start)


MAINTENANCE_HINT = (
    "`heron trace show RUN` and `heron trace export RUN` show each of its requests and replies "
    "as recorded; a turn of the same conversation replays, the summaries it made included."
)


def refused_maintenance(run_id: str, kind: str) -> str:
    """Why a maintenance run (/compact, a memory review) is not replayed: it is no turn of
    the loop, and what it read (the branch and marks as they were, memory's files and review
    cursors) is not rewound to its start, so a replay would not be deterministic."""
    return (
        f"run {run_id} is a {kind} run, made outside any turn: it is recorded for its usage "
        "and cost but not replayed (replay runs a turn's loop again; what this run read, the "
        "conversation as it was and memory's files, is not rewound to its start)"
    )


def set_up(
    store: Store,
    run_id: str,
    registry: ToolRegistry | None = None,
    live_tools: bool = False,
    recorded_specs: bool = False,
) -> ReplaySetup:
    run = load_run(store, run_id)
    if run.turn.maintenance:
        raise StoreError(refused_maintenance(run.turn.run_id, run.turn.kind), hint=MAINTENANCE_HINT)
    if run.start is None and run.problems:
        raise StoreError(
            f"run {run.turn.run_id} cannot be replayed: {run.problems[0]}",
            hint=f"`heron trace show {run.turn.run_id}` shows what of it can still be read.",
        )
    if run.start is None:
        raise StoreError(
            f"run {run.turn.run_id} was recorded without its start and cannot be replayed",
            hint="Runs recorded since traces keep their start (schema m006) replay.",
        )
    start = run.start
    report = ReplayReport(run.turn.run_id, len(run.calls), recorded_stop=run.turn.stop_reason)
    run, report.not_rebuilt = retry_not_rebuilt(run)  # what is replayed: the first run
    payloads = [request_payload(store, c) for c in run.calls]
    provider = ReplayProvider(run, payloads, payload_builder(start), report)
    recorded_tools = _as_recorded(registry or default_registry(), start)
    missing = _missing_tools(recorded_tools, start)
    if missing:
        report.notes.append(f"the run had tools the replay does not: {', '.join(missing)}")
    specs = _recorded_specs(run) if recorded_specs else None
    tools = ReplayTools(run, recorded_tools, live_tools, report, specs)
    drain, should_break = _mailbox(run, provider)
    return ReplaySetup(run, start, report, provider, tools, drain, should_break)


def _as_recorded(registry: ToolRegistry, start: dict[str, Any]) -> ToolRegistry:
    """The tools the run had, with their current specs (so a changed schema shows): a run of
    the tiny offline model had none, a run with a narrower registry had fewer. When the start
    did not record its tools, every tool of `registry`."""
    recorded = (start.get("prompt_inputs") or {}).get("tools")
    if not isinstance(recorded, list):
        return registry
    names = {t.get("name") for t in recorded if isinstance(t, dict)}
    kept = [registry.get(name) for name in registry.names() if name in names]
    tools = ToolRegistry([t for t in kept if t is not None], registry.before_call)
    # How long the kernel lives depends on the process (a one-shot `heron run`, the idle
    # time): described as the recorded run's was, where this code still says it that way.
    for spec in recorded:
        if isinstance(spec, dict) and spec.get("name") == "run_cell":
            lifetime = lifetime_in(str(spec.get("description", "")))
            if lifetime is not None:
                describe_kernel(tools, *lifetime)
    return tools


def _recorded_specs(run: RunTrace) -> list[ToolSpec]:
    """The tools exactly as the run described them to the model (`--recorded-tools`): after an
    upgrade every old run's requests differ at the tools, which hides what else changed."""
    inputs = recorded_inputs(run.start or {})
    if inputs is None or inputs.tools is None:
        raise StoreError(
            f"run {run.turn.run_id} did not record its tools' specs",
            hint="Replay it without --recorded-tools: the current specs are sent.",
        )
    return list(inputs.tools)


def _missing_tools(registry: ToolRegistry, start: dict[str, Any]) -> list[str]:
    """The recorded tools `registry` lacks (a replay given fewer tools than the run had: its
    requests differ at the first one, and this says why)."""
    recorded = (start.get("prompt_inputs") or {}).get("tools")
    if not isinstance(recorded, list):
        return []
    have = set(registry.names())
    names = [t.get("name") for t in recorded if isinstance(t, dict)]
    return [str(n) for n in names if n not in have]
