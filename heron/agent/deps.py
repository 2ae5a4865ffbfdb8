"""What a turn and a slash command read of the process they run in, as one typed protocol.

`Engine` (heron/agent/engine.py) opens these once per process and satisfies `TurnDeps` by its
public attributes. The turn's steps (heron/agent/turn.py) and the commands
(heron/agent/commands.py) are written against `TurnDeps`, so neither imports the engine (no
import cycle through it), and what a step may touch is listed here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from heron.agent.commands import CommandHandler, Recording
    from heron.agent.record import CallSink
    from heron.agent.runner import RunLimits
    from heron.compaction.core import CompactionSetup
    from heron.config import Settings
    from heron.context.prompt import BootstrapCache, PromptMemo
    from heron.context.written import ToolWrites
    from heron.memory.recall import Recall
    from heron.memory.service import MemoryService
    from heron.memory.wiring import RecallReader
    from heron.providers import Provider
    from heron.providers.base import RetryPolicy
    from heron.providers.profiles import ModelChoice
    from heron.redact import Redactor
    from heron.store import Conversation, Store
    from heron.tools.context import Approver, QuestionClock, Spawner
    from heron.tools.python_kernel import Kernels
    from heron.tools.registry import ToolRegistry
    from heron.tools.sandbox import Sandbox
    from heron.trace.recorder import TraceFixed


@dataclass
class Memos:
    """What the process builds once and reuses across turns."""

    prompts: PromptMemo  # system prompts built, by their inputs
    bootstrap: BootstrapCache  # the workspace files, re-read when changed
    # Records which of them a run's tool calls changed (heron/context/written.py).
    tool_writes: ToolWrites | None = None
    trace: TraceFixed | None = None  # what traces take from the fixed settings (agent/tracing.py)
    # (conversation id, window) whose turn was told it is tight (agent/turn.py `_told`): said
    # once per conversation and window in a process, not at every tool turn.
    told_tight: set[tuple[int, int]] = field(default_factory=set)
    # Conversations told that the model cannot use the tools asked for (agent/turn.py
    # `no_tools_note`): once each in a process.
    told_no_tools: set[int] = field(default_factory=set)


@dataclass
class Attached:
    """What heron/proactive attaches to the engine, which never imports it: the services its
    tools find in ToolContext.services, the runtime block's line of a sustained goal, the
    scheduler's wake-up for the `schedule` tool, and slash commands of its own (/goal); and
    what heron/scale adds to /status (how many workers are alive)."""

    subagents: Spawner | None = None
    asks: QuestionClock | None = None
    runtime_notes: Callable[[str], str | None] | None = None
    jobs_changed: Callable[[], None] | None = None
    commands: dict[str, CommandHandler] = field(default_factory=dict)
    status_lines: Callable[[], Awaitable[list[str]]] | None = None


class TurnDeps(Protocol):
    settings: Settings
    store: Store
    provider: Provider
    choice: ModelChoice  # the model, its provider and profile
    registry: ToolRegistry
    sandbox: Sandbox  # where the agent's commands run
    kernels: Kernels  # the Python kernels kept between a conversation's turns
    approve: Approver | None  # the default approver, when the channel brings none
    limits: RunLimits
    retry: RetryPolicy  # each request's stall timeout and deadline
    redactor: Redactor
    memos: Memos  # what the process keeps between turns: prompts, workspace files, trace setup
    memory: MemoryService | None  # None when ephemeral
    memory_baseline: dict[str, str]  # what memory held when the process opened (/learn)
    recall: Recall | None
    recall_reader: RecallReader | None  # auto-recall's own connection while turns overlap
    turns_running: int
    stated_window: int | None  # the window the server stated in an overflow, once it has
    attached: Attached  # what the layers above the engine attach (heron/proactive)

    def compaction_setup(self) -> CompactionSetup: ...

    async def compact_now(
        self,
        conversation: Conversation,
        *,
        reason: str = "manual",
        window: int | None = None,
        on_call: CallSink | None = None,
    ) -> str: ...

    async def archive_for_memory(self, conversation: Conversation) -> None: ...

    def maintenance(
        self, conversation_id: int, kind: str
    ) -> AbstractAsyncContextManager[Recording]: ...

    async def end_kernel(self, conversation: Conversation) -> None: ...
