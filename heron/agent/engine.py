"""The engine: what one process opens to run turns, and closes when it is done.

`Engine.open(settings)` opens the store, the provider, the tool registry (with the sandbox its
commands run in) and memory once; `turn()` hands one message to the turn's state machine
(heron/agent/turn.py), which reads the engine's public attributes as its dependencies. Work
that outlives a command (the /new memory pass) is awaited, with a bound, when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

from heron.agent.deps import Attached, Memos
from heron.agent.maintenance import MaintenanceRun, maintenance
from heron.agent.record import CallSink
from heron.agent.runner import RunLimits
from heron.agent.turn import TurnHooks, TurnResult, run_turn
from heron.compaction import memory_tokens
from heron.compaction.core import CompactionSetup, window_for
from heron.config import Settings
from heron.context.prompt import BootstrapCache, PromptInputs, PromptMemo
from heron.context.written import MARKS_FILE, ToolWrites
from heron.memory import wiring as memory_wiring
from heron.memory.recall import Recall
from heron.memory.refuse import notes_without_secrets
from heron.memory.service import MemoryService
from heron.providers import Provider, open_provider
from heron.providers.base import RetryPolicy
from heron.providers.profiles import ModelChoice
from heron.redact import Redactor, configured_keys
from heron.store import Conversation, Store
from heron.store.engine_state import close_dead_runs
from heron.store.records import NEW_REVIEW
from heron.timefmt import local_date
from heron.tools import approval
from heron.tools.builtin import default_registry
from heron.tools.context import Approver
from heron.tools.message import with_message_tool
from heron.tools.python_kernel import KernelKey, Kernels, describe_kernel
from heron.tools.registry import Tool, ToolRegistry
from heron.tools.sandbox import Sandbox

__all__ = [
    "Engine",
    "TurnHooks",
    "TurnResult",
    "described",
    "engine_tools",
    "opening_registry",
    "redactor_for",
    "view_engine",
]

log = logging.getLogger(__name__)


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
        # The Python kernels, one per conversation, kept between its turns until unused for
        # `[tools] kernel_idle_minutes`, /new, or the engine's close.
        idle = settings.config.tools.kernel_idle_minutes
        self.kernels = Kernels(settings.paths.workspace, self.sandbox, idle)
        self.kernels.alive = self._conversations_alive
        self.store = store
        self.provider = provider
        self.choice = choice
        self.registry = registry
        defaults = settings.config.agent
        self.limits = RunLimits(
            defaults.max_model_calls, defaults.max_tokens_total, defaults.max_continuations
        )
        # Each request's bounds: silence before a stream is cut and retried, and its deadline.
        self.retry = RetryPolicy(
            deadline=defaults.request_deadline, stall_timeout=defaults.stall_timeout
        )
        self.redactor = redactor_for(settings, choice.api_key)
        # Kept between turns. The workspace files lose Heron's own keys as they are read (a
        # command can write them): nothing the prompt or its trace holds carries one.
        keys_only = Redactor(self.redactor.keys, patterns=False)
        # A workspace file Heron's tools changed last is labelled as the agent's notes and
        # loses what memory would refuse as a secret (heron/context/written.py).
        marks = settings.paths.home / MARKS_FILE
        bootstrap = BootstrapCache(keys_only.clean, marks, notes_without_secrets)
        zone = settings.timezone
        writes = ToolWrites(settings.paths.workspace, marks, lambda ts: str(local_date(ts, zone)))
        self.memos = Memos(PromptMemo(), bootstrap, tool_writes=writes)
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
        # What heron/proactive attaches: its tools' services, the goal's runtime line, the
        # scheduler's wake-up and its slash commands (deps.py `Attached`).
        self.attached = Attached()
        # Only read from (`view_engine`): the prompt's Memory section is not frozen by a look.
        self.viewing = False
        # The window the model's server stated as it refused a prompt as too long: every later
        # turn of this process fits it (heron/agent/turn.py `run`).
        self.stated_window: int | None = None

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
        one_shot: bool = False,
        start_model: bool = True,
    ) -> AsyncIterator[Engine]:
        """Open everything a run needs; `provider` replaces the configured one (tests).
        `one_shot`: the process answers one message and ends (`heron run` in-process), so no
        kernel outlives its turn, and a kernel's first cell says so. `start_model=False`: a
        local model loads only when a request needs it (a command that calls no model)."""
        paths = settings.paths.ensure()
        async with AsyncExitStack() as stack:
            where = ":memory:" if ephemeral else settings.database
            store = Store(where, files=None if ephemeral else paths.files)
            stack.callback(store.close)
            if not ephemeral:  # what a killed process left running (a /compact): interrupted
                await store.call(close_dead_runs, store)
            if provider is None:
                choice = settings.model(model)
                provider = await open_provider(choice, stack, start=start_model)
            else:
                choice = ModelChoice("scripted", provider.model)
            if registry is None:
                registry = opening_registry(choice, ephemeral)
            sandbox = await asyncio.to_thread(described, registry, settings)
            engine = cls(settings, store, provider, choice, registry, sandbox)
            idle = settings.config.tools.kernel_idle_minutes
            engine.kernels.idle = 0.0 if one_shot else idle * 60
            engine.kernels.one_shot = one_shot
            stack.push_async_callback(engine.kernels.close)
            await asyncio.to_thread(engine._open_memory, ephemeral)
            if not ephemeral:  # its own connection: the file, or the same PostgreSQL URL
                engine.recall_reader = memory_wiring.RecallReader(where, settings.timezone)
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
            self.memory = MemoryService(
                self.settings.paths.memory, self.store, self.settings.timezone
            )
            self.memory_baseline = memory_digests(self.memory)
            self.memory.section_tokens = memory_tokens(self)
        self.recall = memory_wiring.lazy_recall(self.store, self.settings.timezone)

    def compaction_setup(self) -> CompactionSetup:
        """What compaction reads of this engine, built per call (cheap: references only), so a
        provider swapped in later (tests, the fenced wrapper) is the one it uses."""
        s = self.settings
        return CompactionSetup(
            self.store,
            self.provider,
            self.choice.model,
            self.choice.profile,
            s.config.agent,
            s.config.context,
            s.paths.workspace,
            self.registry.specs,
            self.prompt_inputs,
            forced_window=str(s.env.get("HERON_CONTEXT_WINDOW") or ""),
            stated_window=self.stated_window,
            before_fold=self.memory_before_fold,
            after_fold=self.memory_after_fold,
            prompts=self.memos.prompts,
            maintenance=self.maintenance,
        )

    @property
    def window(self) -> int:
        """The model's window in tokens as this engine runs it: HERON_CONTEXT_WINDOW, else the
        profile (config overrides and what a local GGUF file says included)."""
        return window_for(self)

    def prompt_inputs(self, agent: str, conversation_id: int | None = None) -> PromptInputs:
        """The system prompt's inputs for a conversation: with its frozen Memory section and
        Recent history (heron/memory/wiring.py), so compaction rebuilds the same prompt."""
        workspace = self.settings.paths.workspace
        files = self.memos.bootstrap.read(workspace)
        memory, recent = memory_wiring.prompt_sections(
            self.store, self.memory, conversation_id, take=not self.viewing
        )
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
            written=files.written,
        )

    async def memory_before_fold(
        self, deps: memory_wiring.FoldDeps, conversation_id: int, row_ids: list[int], reason: str
    ) -> str | None:
        """Compaction calls this before folding rows: the extraction pass (queue only); what
        the person is told when it did not run."""
        window = self.window
        return await memory_wiring.before_fold(
            self.memory, deps, conversation_id, row_ids, reason, window
        )

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
        task = asyncio.create_task(self.review_pass(conversation.id, NEW_REVIEW))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def review_pass(self, conversation_id: int, kind: str) -> list[int]:
        """Memory's review pass over the conversation (suggestions only), its model call
        recorded as a maintenance run of `kind` (/new's, a closed chat's)."""
        from heron.memory.extract import review_pass

        if self.memory is None:
            return []
        async with self.maintenance(conversation_id, kind) as run:
            provider = run.provider(self.provider, "review")
            return await review_pass(provider, self.memory, conversation_id, self.window)

    def maintenance(
        self, conversation_id: int, kind: str
    ) -> contextlib.AbstractAsyncContextManager[MaintenanceRun]:
        """A maintenance run of `kind` for model calls made outside any turn
        (heron/agent/maintenance.py)."""
        return maintenance(self, conversation_id, kind)

    async def end_kernel(self, conversation: Conversation) -> None:
        """/new, or the serve deleted the conversation: its kernel ends; a next cell starts an
        empty one."""
        await self.kernels.forget(KernelKey.of(conversation))

    async def _conversations_alive(self, keys: list[KernelKey]) -> set[KernelKey]:
        """Which of the kept kernels' conversations still exist (a few rows, by primary key)."""
        ids = [k.conversation_id for k in keys]
        created = await self.store.call(self.store.created_of, ids)
        return {k for k in keys if created.get(k.conversation_id) == k.created}

    async def settle_background(self, timeout: float = 60.0) -> None:
        """Let background passes finish (bounded), then cancel what is left."""
        if not self.background:
            return
        _, pending = await asyncio.wait(set(self.background), timeout=timeout)
        for task in pending:
            task.cancel()

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
        conversation's lease, RESTORE, COMMAND, BUILD, RUN, SAVE, RESPOND. `channel` is where
        the message came from, named in the runtime block."""
        warning = await self.store.call(self.store.check_file)
        if warning:  # deleted or replaced under us: reopened (heron/store/db.py)
            log.warning("heron: %s", warning)
        self.turns_running += 1
        try:
            return await run_turn(self, key, text, hooks or TurnHooks(), agent, channel)
        finally:
            self.turns_running -= 1

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


def redactor_for(settings: Settings, *keys: str | None) -> Redactor:
    """What scrubs tool results and provider errors: the configured keys always, the secret
    patterns unless `[tools] redact = false`."""
    config = settings.config
    found = configured_keys(config.api_keys, settings.env, *keys)
    return Redactor.of(found, patterns=config.tools.redact)


def offers_tools(choice: ModelChoice) -> bool:
    """Whether `choice` is offered tools. The tiny offline model cannot use them, nor can a
    model whose profile says so (a GGUF whose chat template takes none): describing them only
    confuses it. Without them it cannot call `message` either, so a silent check (the
    heartbeat, a monitor job) could never report (heron/proactive/)."""
    return not choice.embedded and choice.profile.tools


def opening_registry(choice: ModelChoice, ephemeral: bool = False) -> ToolRegistry:
    """The tools an engine opens with for `choice` (`described` next)."""
    return engine_tools(ephemeral) if offers_tools(choice) else ToolRegistry([])


def described(registry: ToolRegistry, settings: Settings) -> Sandbox:
    """Describe run_cell and the command tools as every process of this home describes them,
    and gate them for the sandbox (found here: bwrap tried once). A one-shot `heron run` too:
    tools come first in the cached prefix, so a description that changed with the process
    would miss the whole cache at each switch between `heron run` and `heron chat`; its kernel
    says it ends with the turn in its first cell's result instead."""
    describe_kernel(registry, settings.config.tools.kernel_idle_minutes, one_shot=False)
    return approval.set_up(registry, settings)  # after: the sandbox's sentence comes last


def view_engine(
    settings: Settings,
    store: Store,
    choice: ModelChoice,
    attached: Iterable[Tool] = (),
    running: Engine | None = None,
) -> Engine:
    """An engine to read what the next request of a conversation holds, opening no provider
    and starting nothing (`heron conversations show --model-view/--budget`, the browser's
    compaction panel): `running`'s tools when it is the engine that will send it (the serve's
    own), else the tools `open` gives a process of this home for `choice`, then `attached`, the
    ones the layers above attach (heron/proactive/wiring.py `TOOLS`), as they attach them. Its
    prompt inputs are the engine's own (the workspace files, the conversation's Memory section
    and Recent history), read on `store`; a look never freezes the Memory section."""
    if running is not None:
        registry, sandbox = running.registry, running.sandbox
    else:
        registry = opening_registry(choice)
        sandbox = described(registry, settings)
        for tool in attached:
            if registry.names() and registry.get(tool.name) is None:
                registry.add(tool)
    # Never called: the view is read, no model call is made.
    engine = Engine(settings, store, cast(Provider, None), choice, registry, sandbox)
    engine.viewing = True
    engine._open_memory(ephemeral=False)
    return engine


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
