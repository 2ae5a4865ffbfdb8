"""What a turn writes as it runs: its messages, its model and tool calls' trace rows, its figures.

`TurnRecorder` is RUN's writer. Every message the run adds is committed as it arrives, with
the trace rows held for it (its model call's) in the same transaction; the final reply, the
trace rows still held and the turn row's figures are left to SAVE (`commit_last_writes`, inside
SAVE's one transaction, after its commit-time check). `CallSink` carries compaction's model
calls of a turn (a consolidation at BUILD is made before the recorder exists) into the same
trace and usage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from heron.agent.control import held_rows
from heron.agent.runner import ToolCallRecord
from heron.messages import Message, Usage, dumps
from heron.providers.wire import ModelCallRecord
from heron.store import Store, held
from heron.trace.recorder import TraceRecorder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnFigures:
    """The turn row's closing values (`Store.finish_turn`)."""

    status: str  # done | failed | interrupted
    stop_reason: str
    usage: Usage
    model_calls: int
    tool_calls: int
    system_fingerprint: str
    error: str | None = None
    usage_unknown: bool = False  # a call stopped mid-stream or cut uncounted: a floor

    def after(self, earlier: TurnFigures | None) -> TurnFigures:
        """These figures of a turn's last run with its `earlier` runs' calls, tools and
        tokens added (a run overflowed and the turn ran again): what the turn spent."""
        if earlier is None:
            return self
        return dataclasses.replace(
            self,
            usage=earlier.usage + self.usage,
            model_calls=earlier.model_calls + self.model_calls,
            tool_calls=earlier.tool_calls + self.tool_calls,
            usage_unknown=earlier.usage_unknown or self.usage_unknown,
        )


class CallSink:
    """Where compaction hands its model calls for a turn: held until the turn's recorder is
    attached (a consolidation at BUILD comes before it), then passed on as they happen."""

    def __init__(self) -> None:
        self.held: list[ModelCallRecord] = []
        self.target: Callable[[ModelCallRecord], Awaitable[None]] | None = None

    async def __call__(self, record: ModelCallRecord) -> None:
        if self.target is None:
            self.held.append(record)
        else:
            await self.target(record)

    async def attach(self, target: Callable[[ModelCallRecord], Awaitable[None]]) -> None:
        self.target = target
        held, self.held = self.held, []
        for record in held:
            await target(record)

    def detach(self) -> None:
        self.target = None


class TurnRecorder:
    """Writes one run's messages and trace rows as they happen, and counts its figures."""

    def __init__(
        self,
        store: Store,
        conversation_id: int,
        turn_id: int,
        trace: TraceRecorder | None,
        on_tool_end: Callable[[ToolCallRecord], None] | None = None,
    ) -> None:
        self.store = store
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self.trace = trace  # model and tool calls, mailbox deliveries, breaks
        self.on_tool_end = on_tool_end  # the channel's tool pill, once the call is recorded
        self.usage = Usage()
        self.usage_unknown = False  # a call whose full usage never came (stopped, or cut)
        self.model_calls = 0  # calls recorded (the trace numbers them)
        self.retried = 0  # their attempts that failed and were tried again
        self.tool_calls = 0
        self.stopped_tools = 0  # calls recorded as the stop cut them (`tool_stopped`)

    async def commit(self, messages: list[Message]) -> None:
        await self.store.call(self._append, messages)

    def _append(self, messages: list[Message]) -> None:
        """Messages with the trace rows held for them (their model call's), in one transaction:
        one commit instead of two, and a reply is never on disk without its call's row."""
        with self.store.transaction(), self._joined():
            for message in messages:
                # An injected result's meta names its run.
                meta = message.meta
                self.store.append(self.conversation_id, message, turn_id=self.turn_id, meta=meta)
            # Mail is on disk once: its held rows go as it is stored (heron/store/held.py).
            held.consume(self.store, held_rows(messages))

    def _joined(self) -> contextlib.AbstractContextManager[None]:
        return self.trace.joined() if self.trace is not None else contextlib.nullcontext()

    async def model_call(self, record: ModelCallRecord) -> None:
        usage = record.reply.usage if record.reply else Usage()
        if record.streamed is not None:  # stopped: the usage sent so far, if any
            usage = record.streamed.usage or Usage()
            self.usage_unknown = True
        elif record.reply is not None and record.reply.usage_unknown:  # cut before counted
            self.usage_unknown = True
        self.usage = self.usage + usage
        self.model_calls += 1
        self.retried += record.retried  # each attempt sent is a call of the turn's figures
        if self.trace is None:
            return
        await self.trace.model_call(
            self.model_calls,  # compaction's calls included: the order they were made in
            record.purpose,
            record.payload,
            record.reply,
            record.error,
            record.started,
            record.ended,
            record.body,
            streamed=record.streamed,
            failed=record.failed,
            defer=True,  # written with the reply (`_append`) or with the next trace write
        )

    async def tool_call(self, record: ToolCallRecord) -> None:
        self.tool_calls += 1
        if self.trace is not None:
            await self.trace.tool_call(record, dumps(record.call.args))
        if self.on_tool_end:
            self.on_tool_end(record)

    async def tool_stopped(self, record: ToolCallRecord) -> None:
        """A call the stop cut (`record.stopped`): counted and in the trace, marked
        interrupted; the channel's pill is not told (the turn's stop says it)."""
        self.tool_calls += 1
        self.stopped_tools += 1
        if self.trace is not None:
            await self.trace.tool_call(record, dumps(record.call.args), stopped=True)

    def figures(
        self, status: str, stop: str, error: str | None, system_fingerprint: str
    ) -> TurnFigures:
        return TurnFigures(
            status,
            stop,
            self.usage,
            self.model_calls + self.retried,
            self.tool_calls,
            system_fingerprint,
            error,
            self.usage_unknown,
        )

    async def flush_trace(self) -> None:
        """Write the trace rows still held (a model call whose reply was not stored), if the
        store takes them: the error that ended the run is the one to report."""
        if self.trace is not None:
            try:
                if self.stopped_tools:  # a call ended after a stop (StaleTurn): say where
                    await self.trace.finish("interrupted")
                else:
                    await self.trace.begin()
            except Exception:  # the store itself may be what failed
                log.warning("the trace of turn %s could not be completed", self.turn_id)

    async def interrupted(self, system_fingerprint: str) -> None:
        """A hard break during the run: the trace's interrupted event and the turn row."""
        if self.trace is not None:
            await self.trace.finish("interrupted")
        figures = self.figures("interrupted", "interrupted", None, system_fingerprint)
        await self.store.call(self.finish_turn, figures)

    def finish_turn(self, figures: TurnFigures) -> None:
        """The turn row's closing values, in the caller's transaction."""
        self.store.finish_turn(
            self.turn_id,
            status=figures.status,
            stop_reason=figures.stop_reason,
            usage=figures.usage,
            model_calls=figures.model_calls,
            tool_calls=figures.tool_calls,
            system_fingerprint=figures.system_fingerprint,
            error=figures.error,
            usage_unknown=figures.usage_unknown,
        )

    def commit_last_writes(
        self, final: tuple[Message, ...], figures: TurnFigures, current: bool
    ) -> None:
        """Inside SAVE's transaction: the trace rows still held and, when the turn is still
        current, the final reply held since the model answered and the turn row."""
        with self._joined():
            if not current:
                return
            for message in final:
                self.store.append(self.conversation_id, message, turn_id=self.turn_id)
            self.finish_turn(figures)
