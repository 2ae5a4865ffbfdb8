"""The engine: everything one process needs to run turns, and the turn itself.

`Engine.open(settings)` opens the store, the provider and the tool registry once; `turn()`
runs one user message through the runner, persisting as it goes: the user's message is
committed before the first model call, every assistant message and tool result as it arrives,
every model request and tool call as a trace row.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

from heron.agent.runner import (
    ModelCallRecord,
    RunHooks,
    RunLimits,
    Runner,
    RunResult,
    ToolCallRecord,
    args_json,
)
from heron.config import ModelChoice, Settings
from heron.context.prompt import PromptInputs, build_system_prompt, fingerprint
from heron.errors import ProviderError
from heron.messages import Message, Text, Usage, dumps, reply_to_dict
from heron.providers import Provider, open_provider
from heron.providers.base import OnEvent
from heron.store import Conversation, Store
from heron.tools.registry import ToolContext, ToolRegistry, default_registry


def new_key(prefix: str = "c") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def new_run_id() -> str:
    return f"run_{secrets.token_hex(8)}"


@dataclass
class TurnHooks:
    """What a channel wants to see of a turn as it happens."""

    on_event: OnEvent | None = None
    on_progress: Callable[[str], None] | None = None
    on_tool_start: Callable[..., None] | None = None
    on_tool_end: Callable[[ToolCallRecord], None] | None = None
    on_retry: Callable[[ProviderError, float], None] | None = None


@dataclass
class BuiltTurn:
    """What BUILD hands to RUN: the turn's ids, the system prompt and the model-facing view."""

    run_id: str
    turn_id: int
    system: str
    messages: list[Message]


@dataclass
class TurnResult:
    conversation: Conversation
    run_id: str
    run: RunResult
    system_fingerprint: str
    extra: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.run.text

    @property
    def ok(self) -> bool:
        return self.run.stop in ("done", "wrapup", "length")


class Engine:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        provider: Provider,
        choice: ModelChoice,
        registry: ToolRegistry,
    ) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.choice = choice
        self.registry = registry
        defaults = settings.config.agent
        self.limits = RunLimits(defaults.max_turns, defaults.max_tokens_total)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        settings: Settings,
        *,
        model: str | None = None,
        ephemeral: bool = False,
        provider: Provider | None = None,
        registry: ToolRegistry | None = None,
    ) -> AsyncIterator[Engine]:
        """Open everything a run needs; `provider` replaces the configured one (tests)."""
        paths = settings.paths.ensure()
        async with AsyncExitStack() as stack:
            store = Store(":memory:" if ephemeral else paths.db)
            stack.callback(store.close)
            if provider is None:
                choice = settings.model(model)
                provider = await open_provider(choice, stack)
            else:
                choice = ModelChoice("scripted", provider.model)
            yield cls(settings, store, provider, choice, registry or default_registry())

    def system_prompt(self, agent: str) -> str:
        inputs = PromptInputs(agent, self.settings.paths.workspace, self.registry.specs())
        return build_system_prompt(inputs)

    async def turn(
        self, key: str, text: str, hooks: TurnHooks | None = None, *, agent: str = "default"
    ) -> TurnResult:
        """One user message through the steps of a turn: restore, build, run, save."""
        hooks = hooks or TurnHooks()
        conversation = await self._restore(key, agent)
        built = await self._build(conversation, text, agent)
        run = await self._run(conversation, built, hooks)
        return TurnResult(conversation, built.run_id, run, fingerprint(built.system))

    async def _restore(self, key: str, agent: str) -> Conversation:
        return await asyncio.to_thread(self.store.open_conversation, key, agent)

    async def _build(self, conversation: Conversation, text: str, agent: str) -> BuiltTurn:
        """Assemble what the model will see and commit the user's message before any call."""
        history = await asyncio.to_thread(self.store.branch, conversation.id)
        run_id = new_run_id()
        user_message = Message("user", [Text(text)])
        turn_id, _ = await asyncio.to_thread(
            self.store.begin_turn,
            conversation.id,
            run_id,
            user_message,
            provider=self.choice.provider,
            model=self.choice.model,
        )
        if conversation.title is None:
            await asyncio.to_thread(self.store.set_title, conversation.id, _title(text))
        system = self.system_prompt(agent)
        messages = [m.wire for m in history] + [user_message]
        return BuiltTurn(run_id, turn_id, system, messages)

    async def _run(
        self, conversation: Conversation, built: BuiltTurn, hooks: TurnHooks
    ) -> RunResult:
        turn_id, system = built.turn_id, built.system
        ctx = ToolContext(
            workspace=self.settings.paths.workspace,
            result_budget=self.settings.config.agent.result_budget,
        )
        recorder = _Recorder(self.store, conversation.id, turn_id, hooks)
        runner = Runner(self.provider, self.registry, self.choice.profile, self.limits)
        run_hooks = RunHooks(
            on_event=hooks.on_event,
            on_progress=hooks.on_progress,
            on_message=recorder.message,
            on_model_call=recorder.model_call,
            on_tool_call=recorder.tool_call,
            on_tool_start=hooks.on_tool_start,
            on_retry=hooks.on_retry,
        )
        try:
            run = await runner.run(system, built.messages, ctx, run_hooks)
        except asyncio.CancelledError:
            await asyncio.shield(recorder.finish("interrupted", "interrupted", None, system))
            raise
        finally:
            await ctx.aclose()
        status = "failed" if run.stop == "error" else "done"
        error = str(run.error) if run.error else None
        await recorder.finish(status, run.stop, error, system, run)
        return run


class _Recorder:
    """Writes a run's messages and trace rows as they happen."""

    def __init__(self, store: Store, conversation_id: int, turn_id: int, hooks: TurnHooks):
        self.store = store
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self.hooks = hooks
        self.usage = Usage()
        self.model_calls = 0
        self.tool_calls = 0

    async def message(self, message: Message) -> None:
        await asyncio.to_thread(
            self.store.append, self.conversation_id, message, turn_id=self.turn_id
        )

    async def model_call(self, record: ModelCallRecord) -> None:
        usage = record.reply.usage if record.reply else Usage()
        self.usage = self.usage + usage
        self.model_calls += 1
        reply = dumps(reply_to_dict(record.reply)) if record.reply else None
        await asyncio.to_thread(
            self.store.record_model_call,
            self.turn_id,
            record.seq,
            request=record.payload,
            reply=reply,
            usage=usage,
            error=record.error,
            started=record.started,
            ended=record.ended,
            purpose=record.purpose,
        )

    async def tool_call(self, record: ToolCallRecord) -> None:
        self.tool_calls += 1
        content = record.result.content
        await asyncio.to_thread(
            self.store.record_tool_call,
            self.turn_id,
            call_id=record.call.id,
            name=record.call.name,
            args=args_json(record.call),
            result=content,
            result_sha256=hashlib.sha256(content.encode()).hexdigest(),
            is_error=record.result.is_error,
            effects=dumps(record.effects) if record.effects else None,
            started=record.started,
            ended=record.ended,
        )
        if self.hooks.on_tool_end:
            self.hooks.on_tool_end(record)

    async def finish(
        self,
        status: str,
        stop: str,
        error: str | None,
        system: str,
        run: RunResult | None = None,
    ) -> None:
        await asyncio.to_thread(
            self.store.finish_turn,
            self.turn_id,
            status=status,
            stop_reason=stop,
            usage=self.usage,
            model_calls=self.model_calls,
            tool_calls=self.tool_calls,
            system_fingerprint=fingerprint(system),
            error=error,
        )


def _title(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(empty)"
    return line[:60] + ("…" if len(line) > 60 else "")
