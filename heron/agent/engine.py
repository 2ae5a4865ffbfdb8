"""The engine: everything one process needs to run turns, and the turn itself.

`Engine.open(settings)` opens the store, the provider and the tool registry once; `turn()`
runs one user message through the runner, persisting as it goes: the user's message is
committed before the first model call, every assistant message and tool result as it arrives,
every model request and tool call as a trace row.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from heron.agent.commands import CommandHandler
from heron.agent.runner import (
    ModelCallRecord,
    RunHooks,
    RunLimits,
    Runner,
    RunResult,
    ToolCallRecord,
)
from heron.agent.tracing import trace_for
from heron.agent.turn import (
    BuiltTurn,
    CallSink,
    StaleTurn,
    TurnControl,
    TurnHooks,
    TurnMachine,
    TurnResult,
    guard_run_hooks,
)
from heron.compaction import memory_tokens, prepare_turn
from heron.config import Settings
from heron.context.prompt import (
    BootstrapCache,
    PromptInputs,
    PromptMemo,
    fingerprint,
)
from heron.context.runtime import RuntimeInfo, with_runtime
from heron.memory import wiring as memory_wiring
from heron.memory.recall import Recall
from heron.memory.service import MemoryService
from heron.messages import Message, Text, Usage, dumps, scrub_text
from heron.providers import Provider, open_provider
from heron.providers.base import RetryPolicy
from heron.providers.profiles import ModelChoice
from heron.redact import Redactor, configured_keys
from heron.store import Conversation, Store
from heron.tools import approval
from heron.tools.approval import Approver
from heron.tools.builtin import default_registry
from heron.tools.message import with_message_tool
from heron.tools.registry import ToolContext, ToolRegistry
from heron.tools.sandbox import Sandbox
from heron.trace.recorder import TraceRecorder

log = logging.getLogger(__name__)


def new_key(prefix: str = "c") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def new_run_id() -> str:
    return f"run_{secrets.token_hex(8)}"


class Engine:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        provider: Provider,
        choice: ModelChoice,
        registry: ToolRegistry,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.settings = settings
        # Where the agent's commands run (bubblewrap, or unconfined and gated by approval), and
        # who asks the person when approval is "ask" and the turn's channel does not (tests, a
        # caller of `turn` without the AgentLoop; heron/tools/approval.py).
        self.sandbox = sandbox or Sandbox(settings.paths.workspace, settings.paths.home)
        self.approve: Approver | None = None
        self.store = store
        self.provider = provider
        self.choice = choice
        self.registry = registry
        defaults = settings.config.agent
        self.limits = RunLimits(
            defaults.max_turns, defaults.max_tokens_total, defaults.max_continuations
        )
        # Each request's bounds: silence before a stream is cut and retried, and its deadline.
        self.retry = RetryPolicy(
            deadline=defaults.request_deadline, stall_timeout=defaults.stall_timeout
        )
        self.bootstrap_cache = BootstrapCache()  # the workspace files, re-read when changed
        self.prompt_memo = PromptMemo()  # system prompts built, by their inputs
        self.trace_memo: dict[str, Any] = {}  # what traces take from the fixed settings
        # Memory (heron/memory): None when ephemeral; recall over every message; what memory
        # held when the engine opened (for /learn).
        self.memory: MemoryService | None = None
        self.recall: Recall | None = None
        self.memory_baseline: dict[str, str] = {}
        # Work that outlives the command that started it (the /new memory pass); awaited, with
        # a bound, when the engine closes so nothing is cut off mid-write.
        self.background: set[asyncio.Task[Any]] = set()
        self.turns_running = 0  # turns in flight: auto-recall leaves the loop when more than one
        self.recall_reader: memory_wiring.RecallReader | None = None  # (none when ephemeral)
        # Set by a scheduler running in this process (heron/proactive): told when the
        # `schedule` tool made a job, so it wakes at once instead of at its next poll.
        self.jobs_changed: Callable[[], None] | None = None
        self.redactor = redactor_for(settings, choice.api_key, getattr(provider, "api_key", None))
        # What heron/proactive attaches: services its tools find in ToolContext.extra (the
        # subagent manager, goals), and a line for the runtime block (the goal), read by key.
        self.tool_extras: dict[str, Any] = {}
        self.runtime_notes: Callable[[str], str | None] | None = None
        # Slash commands of the services above the engine (e.g. /goal, heron/proactive/goals.py),
        # added by what attaches them, so the engine never imports those services.
        self.more_commands: dict[str, CommandHandler] = {}

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
            if registry is None:
                # The tiny offline model cannot use tools; describing them only confuses it.
                registry = ToolRegistry([]) if choice.embedded else engine_tools(ephemeral)
            sandbox = await asyncio.to_thread(approval.set_up, registry, settings)
            engine = cls(settings, store, provider, choice, registry, sandbox)
            await asyncio.to_thread(engine._open_memory, ephemeral)
            if not ephemeral:
                engine.recall_reader = memory_wiring.RecallReader(paths.db)
                stack.push_async_callback(engine.recall_reader.aclose)
            try:
                yield engine
            finally:
                await engine.settle_background()

    def _open_memory(self, ephemeral: bool) -> None:
        """The memory service and recall; the embedding model is not loaded here (it takes
        seconds): it loads on the first semantic search."""
        from heron.memory.commands import memory_digests

        if not ephemeral:
            self.memory = MemoryService(self.settings.paths.memory, self.store)
            self.memory_baseline = memory_digests(self.memory)
            self.memory.section_tokens = memory_tokens(self)
        self.recall = memory_wiring.lazy_recall(self.store)

    def prompt_inputs(self, agent: str, conversation_id: int | None = None) -> PromptInputs:
        """The system prompt's inputs for a conversation: with its frozen Memory section and
        Recent history (heron/memory/wiring.py), so compaction rebuilds the same prompt."""
        workspace = self.settings.paths.workspace
        files = self.bootstrap_cache.read(workspace)
        memory, recent = memory_wiring.prompt_sections(self.store, self.memory, conversation_id)
        specs = self.registry.specs()
        brief = self.choice.profile.brief_prompt
        return PromptInputs(
            agent,
            workspace,
            specs,
            memory=memory,
            recent_history=recent,
            bootstrap=files,
            brief=brief,
        )

    async def memory_before_fold(
        self, deps: object, conversation_id: int, row_ids: list[int], reason: str
    ) -> None:
        """Compaction calls this before folding rows: the extraction pass (queue only)."""
        await memory_wiring.before_fold(self.memory, deps, conversation_id, row_ids, reason)

    async def memory_after_fold(self, conversation_id: int) -> None:
        await asyncio.to_thread(memory_wiring.thaw, self.memory, conversation_id)

    async def archive_for_memory(self, conversation: Conversation) -> None:
        """/new: thaw the Memory section, floor recent history at this moment, and read what
        was said since the last review for facts worth keeping, in the background. The pass
        only writes to the review queue; nothing runs for --ephemeral or the tiny offline
        model, which cannot extract anything useful."""
        await asyncio.to_thread(memory_wiring.thaw, self.memory, conversation.id, new=True)
        if self.memory is None or self.choice.embedded:
            return
        from heron.memory.extract import review_pass

        task = asyncio.create_task(review_pass(self.provider, self.memory, conversation.id))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def settle_background(self, timeout: float = 60.0) -> None:
        """Let background passes finish (bounded), then cancel what is left."""
        if not self.background:
            return
        _, pending = await asyncio.wait(set(self.background), timeout=timeout)
        for task in pending:
            task.cancel()

    def _before_message(
        self, conversation_id: int, text: str, strong: bool | None = None
    ) -> str | None:
        """Before the user's message is committed: auto-recall (stored as rows just before it,
        so later requests replay them) and the runtime block's memory note. `strong`: whether
        the search found a hit strong enough, when already asked (`_recall_check`)."""
        from heron.memory.recall import AUTO_RECALL_MIN_SCORE

        memory_wiring.recall_rows(
            self.store, self.recall, conversation_id, text, AUTO_RECALL_MIN_SCORE, strong
        )
        return memory_wiring.memory_note(self.memory, conversation_id)

    async def _recall_check(self, text: str) -> bool | None:
        """Auto-recall's search on its own connection and thread while other turns run (it is
        mostly SQLite time, which then overlaps the loop's work); None: search inline."""
        from heron.memory.recall import AUTO_RECALL_MIN_SCORE

        reader = self.recall_reader
        if reader is None or self.recall is None or self.turns_running < 2:
            return None
        if not memory_wiring.wants_recall(text):
            return False
        return await reader.strong(text, AUTO_RECALL_MIN_SCORE)

    async def turn(
        self,
        key: str,
        text: str,
        hooks: TurnHooks | None = None,
        *,
        agent: str = "default",
        channel: str = "cli",
    ) -> TurnResult:
        """One user message through the turn's state machine (heron/agent/turn.py): under the
        conversation's lease, RESTORE, COMPACT, COMMAND, BUILD, RUN, SAVE, RESPOND. `channel`
        is where the message came from, named in the runtime block."""
        warning = await self.store.call(self.store.check_file)
        if warning:  # deleted or replaced under us: reopened (heron/store/db.py)
            log.warning("heron: %s", warning)
        self.turns_running += 1
        try:
            machine = TurnMachine(self)
            return await machine.turn(key, text, hooks or TurnHooks(), agent, channel)
        finally:
            self.turns_running -= 1

    async def compact_before_turn(self, conversation: Conversation) -> None:
        """COMPACT state: compaction (issue 3) replaces this to pick up pending work."""
        return None

    async def compact_now(
        self,
        conversation: Conversation,
        *,
        reason: str = "manual",
        window: int | None = None,
        on_call: CallSink | None = None,
    ) -> str:
        """Compact the conversation now (/compact, a context overflow)."""
        from heron.compaction import compact_now

        return await compact_now(self, conversation, reason=reason, window=window, on_call=on_call)

    async def _restore(self, key: str, agent: str) -> Conversation:
        return await self.store.call(self.store.open_conversation, key, agent)

    async def _build(
        self,
        conversation: Conversation,
        text: str,
        agent: str,
        *,
        channel: str = "cli",
        answer: int | None = None,
        meta: dict[str, Any] | None = None,
        bare: bool = False,
        provenance: str = "user",
    ) -> BuiltTurn:
        """Commit the user's message (with the runtime block it is sent with) before any call,
        compact if the conversation outgrew its share of the window, and derive the view.
        `answer`: a message already stored (/retry after a failed turn), answered as it is.
        `provenance`: who sent it; anything but the person is stored as Heron's (author)."""
        run_id = new_run_id()
        if answer is None:
            turn_id, user_id = await self._commit_message(
                conversation, run_id, text, channel, meta, bare, provenance
            )
        else:
            turn_id = await self.store.call(
                self.store.start_turn,
                conversation.id,
                run_id,
                user_message_id=answer,
                provider=self.choice.provider,
                model=self.choice.model,
            )
            user_id = answer
        sink = CallSink()
        prepared = await prepare_turn(self, conversation, agent, turn_id, user_id, on_call=sink)
        return BuiltTurn(
            run_id,
            turn_id,
            prepared.system,
            prepared.messages,
            prepared.governor,
            sink,
            prepared.notices,
        )

    async def _commit_message(
        self,
        conversation: Conversation,
        run_id: str,
        text: str,
        channel: str,
        meta: dict[str, Any] | None = None,
        bare: bool = False,
        provenance: str = "user",
    ) -> tuple[int, int]:
        """Auto-recall, then the user's message with its turn row, in one commit. `meta`: a
        message Heron opens the turn with (a subagent's result or task), authored by Heron;
        `bare`: no auto-recall (a subagent is blind to the conversations by design)."""
        text, _ = scrub_text(text)  # a channel that let undecodable bytes through: U+FFFD
        user_message = Message("user", [Text(text)])
        note = None if bare else await self._recall_and_note(conversation, text)
        zone = self.settings.config.agent.timezone
        info = RuntimeInfo(channel, conversation.key, zone, note=note)
        turn_id, stored = await self.store.call(
            self.store.begin_turn,
            conversation.id,
            run_id,
            user_message,
            # A tiny model takes the runtime block for the question (measured: Paris is lost
            # from "What is the capital of France?"), so a brief-prompt model is sent none.
            sent=None if self.choice.profile.brief_prompt else with_runtime(user_message, info),
            provider=self.choice.provider,
            model=self.choice.model,
            # A scheduled job's prompt is not the person's words (memory never quotes it).
            meta=meta
            if meta is not None or provenance == "user"
            else {"injected_event": provenance},
        )
        if conversation.title is None:
            await self.store.call(self.store.set_title, conversation.id, _title(text))
        return turn_id, stored.id

    async def _recall_and_note(self, conversation: Conversation, text: str) -> str | None:
        strong = await self._recall_check(text)
        # Inline while the history is small (a thread hop costs more than the search then);
        # nothing left to search when the reader found no strong hit.
        searching = strong is not False
        slow = searching and await self.store.call(memory_wiring.search_is_slow, self.store)
        hop = self.store.call_slow if slow else self.store.call
        return await hop(self._notes_before, conversation, text, strong)

    def _notes_before(
        self, conversation: Conversation, text: str, strong: bool | None
    ) -> str | None:
        """In one hop to the store's thread: recall and the memory note, and the line of a
        sustained goal (heron/proactive/goals.py) for the runtime block."""
        note = self._before_message(conversation.id, text, strong)
        extra = self.runtime_notes(conversation.key) if self.runtime_notes is not None else None
        return "\n".join(n for n in (note, extra) if n) or None

    async def _run(
        self, conversation: Conversation, built: BuiltTurn, hooks: TurnHooks
    ) -> RunResult:
        turn_id, system = built.turn_id, built.system
        ctx = ToolContext(
            workspace=self.settings.paths.workspace,
            result_budget=self.settings.config.agent.result_budget,
            redactor=self.redactor,
            sandbox=self.sandbox,
        )
        approve = hooks.approve or self.approve  # the channel's, else the engine's default
        if approve is not None:
            ctx.extra["approve"] = approve
        # work_state, todos and scratchpad (heron/tools) keep their data per conversation/agent.
        ctx.extra.update(
            store=self.store, conversation_id=conversation.id, agent=conversation.agent
        )
        ctx.extra.update(memory=self.memory, conversation_key=conversation.key, recall=self.recall)
        ctx.extra.update(self.tool_extras)  # services of heron/proactive (subagents, goals)
        options = hooks.control.options if hooks.control is not None else None
        registry, limits, retry = self._bounds(options)
        # The `schedule` tool (heron/tools/schedule.py): the user's timezone, the home whose
        # `heron serve` fires jobs, and this process's scheduler when one runs.
        ctx.extra.update(
            timezone=self.settings.config.agent.timezone,
            home=self.settings.paths.home,
            jobs_changed=self.jobs_changed,
        )
        trace = trace_for(self, built, conversation.agent)
        recorder = _Recorder(
            self.store, conversation.id, turn_id, hooks, trace, self.prompt_memo.fingerprint
        )
        await built.compaction_calls.attach(recorder.model_call)  # in the trace, in the usage
        if hooks.on_notice is not None:
            for notice in built.notices:
                hooks.on_notice(notice)
        profile = self.choice.profile
        runner = Runner(self.provider, registry, profile, limits, retry, self.redactor)
        run_hooks = RunHooks(
            on_event=hooks.on_event,
            on_progress=hooks.on_progress,
            on_message=recorder.message,
            on_model_call=recorder.model_call,
            on_tool_call=recorder.tool_call,
            on_tool_start=hooks.on_tool_start,
            on_retry=hooks.on_retry,
        )
        if built.governor is not None:  # the view from the record, compaction in flight
            run_hooks.govern = built.governor.govern
            run_hooks.on_model_call = built.governor.observing(run_hooks.on_model_call)
        if hooks.control is not None:  # token checks, checkpoints, mailbox, break (turn.py)
            hooks.control.hold_final = True  # SAVE commits the final reply (`_last_writes`)
            run_hooks = guard_run_hooks(run_hooks, hooks.control, self.store, ctx)
        run_hooks = recorder.wrap(run_hooks)  # mailbox deliveries and breaks go in the trace
        try:
            run = await runner.run(system, built.messages, ctx, run_hooks)
        except asyncio.CancelledError:
            await asyncio.shield(recorder.finish("interrupted", "interrupted", None, system))
            raise
        except Exception as error:
            if hooks.control is not None and not isinstance(error, StaleTurn):
                await recorder.commit_held(hooks.control)  # a final reply held for SAVE
            await recorder.flush_trace()  # rows held for a reply that never got stored
            raise
        finally:
            built.compaction_calls.detach()
            await ctx.aclose()
        status = "failed" if run.stop == "error" else "done"
        error = str(run.error) if run.error else None
        await recorder.finish(status, run.stop, error, system, run, hooks.control)
        return run

    def _bounds(self, options: Any) -> tuple[ToolRegistry, RunLimits, RetryPolicy]:
        """The tools, ceilings and request deadline of a run: the engine's, narrowed by the
        TurnOptions of a turn Heron started (a subagent's own ceilings and tools; a goal's
        turn has no wall-clock model deadline, long autonomous work is expected)."""
        registry, limits, retry = self.registry, self.limits, self.retry
        if options is None:
            return registry, limits, retry
        if options.max_model_calls is not None:
            limits = dataclasses.replace(limits, max_turns=options.max_model_calls)
        if options.max_tokens is not None:
            limits = dataclasses.replace(limits, max_tokens_total=options.max_tokens)
        if options.tools is not None or options.without:
            keep = set(options.tools) if options.tools is not None else set(registry.names())
            keep -= set(options.without)
            chosen = [t for name in registry.names() if name in keep and (t := registry.get(name))]
            registry = ToolRegistry(chosen, before_call=registry.before_call)
        if options.no_deadline:
            retry = dataclasses.replace(retry, deadline=NO_DEADLINE)
        return registry, limits, retry


# A goal's turn: no wall-clock deadline on a model request (the stall timeout still cuts a
# silent stream); a year, not infinity, so the timer arithmetic stays finite.
NO_DEADLINE = 365 * 24 * 3600.0


def redactor_for(settings: Settings, *keys: str | None) -> Redactor:
    """What scrubs tool results and provider errors: the configured keys always, the secret
    patterns unless `[tools] redact = false`."""
    config = settings.config
    found = configured_keys(config.api_keys, settings.env, *keys)
    return Redactor.of(found, patterns=config.tools.redact)


def engine_tools(ephemeral: bool = False) -> ToolRegistry:
    """The tools an engine opens with for a model that can use them (a replay rebuilds the
    same list): the built-ins, the memory tools (an ephemeral run keeps no memory, so only
    recall_history), `schedule` (not for an ephemeral run: its jobs would belong to a
    conversation that is never stored) and `message` (every channel's turn can deliver,
    through the AgentLoop)."""
    from heron.tools.memory_tools import MEMORY_TOOLS, recall_history
    from heron.tools.schedule import schedule

    registry = default_registry()
    for t in [recall_history] if ephemeral else MEMORY_TOOLS:
        if registry.get(t.name) is None:
            registry.add(t)
    if not ephemeral and registry.get(schedule.name) is None:
        registry.add(schedule)
    return with_message_tool(registry)


class _Recorder:
    """Writes a run's messages and trace rows as they happen."""

    def __init__(
        self,
        store: Store,
        conversation_id: int,
        turn_id: int,
        hooks: TurnHooks,
        trace: TraceRecorder | None = None,
        fingerprint: Callable[[str], str] = fingerprint,
    ):
        self.store = store
        self.fingerprint = fingerprint  # of the system prompt, for the turn's record
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self.hooks = hooks
        self.trace = trace  # heron.trace: model and tool calls, injections, breaks
        self.usage = Usage()
        self.model_calls = 0
        self.tool_calls = 0

    async def message(self, message: Message) -> None:
        await self.store.call(self._append, message)

    def _append(self, message: Message) -> None:
        """A message with the trace rows held for it (its model call's), in one transaction:
        one commit instead of two, and a reply is never on disk without its call's row."""
        joined = self.trace.joined() if self.trace is not None else contextlib.nullcontext()
        meta = getattr(message, "meta", None)  # an injected result names its run (turn.Injected)
        with self.store.transaction(), joined:
            self.store.append(self.conversation_id, message, turn_id=self.turn_id, meta=meta)

    async def commit_held(self, control: TurnControl) -> None:
        """The run failed after its final reply was held for SAVE: keep the reply, unless the
        turn is no longer current."""
        held, control.held = control.held, []
        if held and await control.current(self.store):
            for message in held:
                await self.message(message)

    async def model_call(self, record: ModelCallRecord) -> None:
        usage = record.reply.usage if record.reply else Usage()
        self.usage = self.usage + usage
        self.model_calls += 1
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
            getattr(record, "body", None),  # compaction's calls carry only the text
            defer=True,  # written with the reply (`_append`) or with the next trace write
        )

    async def tool_call(self, record: ToolCallRecord) -> None:
        self.tool_calls += 1
        if self.trace is not None:
            await self.trace.tool_call(record, dumps(record.call.args))
        if self.hooks.on_tool_end:
            self.hooks.on_tool_end(record)

    async def flush_trace(self) -> None:
        """Write the trace rows still held (a model call whose reply was not stored), if the
        store takes them: the error that ended the run is the one to report."""
        if self.trace is not None:
            try:
                await self.trace.begin()
            except Exception:  # the store itself may be what failed
                log.warning("the trace of turn %s could not be completed", self.turn_id)

    def wrap(self, run_hooks: RunHooks) -> RunHooks:
        return self.trace.wrap(run_hooks) if self.trace is not None else run_hooks

    async def injection(self, messages: list[Message]) -> None:
        """The mailbox delivered `messages` into the run (recorded for replay)."""
        if self.trace is not None:
            await self.trace.injection(messages)

    async def break_(self, kind: str, **detail: object) -> None:
        """A soft or hard break was taken (recorded for replay)."""
        if self.trace is not None:
            await self.trace.break_(kind, **detail)

    async def finish(
        self,
        status: str,
        stop: str,
        error: str | None,
        system: str,
        run: RunResult | None = None,
        control: TurnControl | None = None,
    ) -> None:
        """The turn row's figures and status. With the turn machine's `control`, they are
        written by SAVE, in the transaction of its commit-time check (`TurnControl.settle`),
        with the trace rows and the final reply still held (`_last_writes`)."""
        write = functools.partial(
            self.store.finish_turn,
            self.turn_id,
            status=status,
            stop_reason=stop,
            usage=self.usage,
            model_calls=self.model_calls,
            tool_calls=self.tool_calls,
            system_fingerprint=self.fingerprint(system),
            error=error,
        )
        if control is None:
            if self.trace is not None:
                await self.trace.finish(status)
            await self.store.call(write)
            return
        control.finish = functools.partial(self._last_writes, control, write)

    def _last_writes(self, control: TurnControl, write: Callable[[], None], current: bool) -> None:
        """Inside SAVE's transaction: the trace rows still held, and when the turn is still
        current, the final reply the guard held (`TurnControl.hold_final`) and the turn row."""
        held, control.held = control.held, []
        joined = self.trace.joined() if self.trace is not None else contextlib.nullcontext()
        with joined:
            if current:
                for message in held:
                    self.store.append(self.conversation_id, message, turn_id=self.turn_id)
                write()


def _title(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(empty)"
    return line[:60] + ("…" if len(line) > 60 else "")
