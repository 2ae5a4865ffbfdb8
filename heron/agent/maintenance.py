"""Model calls Heron makes outside any turn, recorded as runs of their own.

`/compact`, idle compaction, `/learn`, the memory review a chat starts as it closes (and the
one /new starts), and the nightly review call the model with no person's turn around them.
Each such operation is a *maintenance run*: a `turns` row of the conversation it worked on,
its `kind` saying what it was (migration m025), with its model calls as trace rows like a
turn's (the exact request, the reply or error, usage), so `heron usage`, `heron trace` and a
conversation's cost count them; the conversation's turn count does not.

The row is made at the run's first model call: an operation that calls no model (nothing to
fold, nothing to review) leaves no run. Recording changes no request: the body recorded is
encoded beside the one the provider sends (`heron.providers.wire.call_recorded`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from heron.agent.record import TurnRecorder
from heron.agent.tracing import engine_fixed
from heron.messages import JSONObject, Reply
from heron.providers.wire import ModelCallRecord, call_recorded
from heron.store.engine_state import HOST
from heron.trace.recorder import RunStart, TraceRecorder

if TYPE_CHECKING:
    from heron.agent.deps import TurnDeps
    from heron.providers.base import Provider
    from heron.request import ChatRequest, OnEvent

log = logging.getLogger(__name__)


@dataclass
class MaintenanceRun:
    """One maintenance run while it works: called with each model call (a compaction
    `on_call` sink), or lending `provider(...)`, a provider whose calls it records."""

    engine: TurnDeps
    conversation_id: int
    kind: str
    recorder: TurnRecorder | None = None
    errors: list[str] = field(default_factory=list)

    async def __call__(self, record: ModelCallRecord) -> None:
        recorder = self.recorder or await self._open()
        if record.error is not None:
            self.errors.append(record.error)
        await recorder.model_call(record)
        if recorder.trace is not None:
            await recorder.trace.begin()  # written now: a run is not held for a reply row

    @property
    def answered(self) -> bool:
        """The run called the model and every call answered: the model works."""
        return self.recorder is not None and not self.errors

    def fail(self, reason: str) -> None:
        """The operation failed though no call raised (a summary that wrote nothing)."""
        self.errors.append(reason)

    def provider(self, inner: Provider, purpose: str) -> RecordingProvider:
        """`inner`, with each call recorded in this run under `purpose`."""
        return RecordingProvider(inner, self, purpose)

    async def _open(self) -> TurnRecorder:
        engine, store = self.engine, self.engine.store
        provider = engine.provider
        run_id = f"run_{secrets.token_hex(8)}"
        turn_id = await store.call(
            store.start_turn,
            self.conversation_id,
            run_id,
            user_message_id=None,
            provider=provider.name,
            model=provider.model,
            kind=self.kind,
            process=(HOST, os.getpid()),  # what tells its process is gone (m027)
        )
        fixed = engine_fixed(engine)
        # No system prompt or view of its own: each call carries its own request.
        start = RunStart("default", provider.name, provider.model, "", fixed.profile)
        # Written off the loop: a summary's request is a whole transcript (a long one's, hashed
        # and split into blobs, held the loop for a tenth of a second and more).
        trace = TraceRecorder(store, turn_id, start, fixed.scrubber, own_chain=True, off_loop=True)
        self.recorder = TurnRecorder(store, self.conversation_id, turn_id, trace)
        return self.recorder

    async def close(self, error: BaseException | None) -> None:
        """The run row's figures: failed when a call failed (or the operation raised),
        interrupted when it was cancelled."""
        recorder = self.recorder
        if recorder is None:
            return
        status, stop = "done", "done"
        message = self.errors[-1] if self.errors else None
        if isinstance(error, asyncio.CancelledError):
            status, stop = "interrupted", "interrupted"
        elif error is not None or message is not None:
            status, stop = "failed", "error"
            message = message if error is None else repr(error)
        await recorder.flush_trace()
        figures = recorder.figures(status, stop, message, "")
        await recorder.store.call(recorder.finish_turn, figures)


@dataclass
class RecordingProvider:
    """A provider whose every call is recorded in a maintenance run (memory's passes, which
    take a provider rather than a sink)."""

    inner: Provider
    run: MaintenanceRun
    purpose: str
    name: str = field(init=False)
    model: str = field(init=False)

    def __post_init__(self) -> None:
        self.name, self.model = self.inner.name, self.inner.model

    def payload(self, request: ChatRequest) -> JSONObject:
        return self.inner.payload(request)

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        return await call_recorded(self.inner, request, self.purpose, self.run, on_event)

    async def aclose(self) -> None:
        """The inner provider is the engine's: it closes it."""


@asynccontextmanager
async def maintenance(
    engine: TurnDeps, conversation_id: int, kind: str
) -> AsyncIterator[MaintenanceRun]:
    """A maintenance run of `kind` in the conversation for the block's model calls; its row
    (if a call was made) is closed as the block ends, failed or interrupted as it ended."""
    run = MaintenanceRun(engine, conversation_id, kind)
    try:
        yield run
    except BaseException as error:
        try:
            await asyncio.shield(run.close(error))
        except Exception:  # the operation's own error is the one to report
            log.warning("the %s run of conversation %s could not be closed", kind, conversation_id)
        raise
    await run.close(None)
