"""What a tool is given when it runs: `ToolContext`, and the turn's services in `TurnServices`.

The turn (heron/agent/turn.py) builds one ToolContext per run. Every service a tool may reach is
a typed field, None when the run has no such service (a bare context in a test, an ephemeral
run, a replay): a tool says so to the model instead of failing. Where the service belongs to a
layer above the tools (the running turn of heron/agent/, the subagents and questions of
heron/proactive/), the field's type is a Protocol here naming only what the tools use, so the
tools never import those layers (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from heron.messages import JSONObject, ToolResult

if TYPE_CHECKING:
    from heron.memory.recall import Recall
    from heron.memory.service import MemoryService
    from heron.redact import Redactor
    from heron.store import Store
    from heron.store.runs import Run
    from heron.tools.sandbox import Sandbox

# (tool name, the exact command or code, whether it runs confined by the sandbox: approval
# "ask" with bubblewrap working) -> None when the person approves, else why not.
Approver = Callable[[str, str, bool], Awaitable[str | None]]

# The scratchpad's bounds (heron/tools/scratchpad.py): bytes per file, files, bytes in all.
SCRATCHPAD_LIMITS = (5 * 1024 * 1024, 2_000, 1024 * 1024 * 1024)


class RunSession(Protocol):
    """A process a tool keeps for the rest of its run (the Python kernel): shut down with the
    run, or given back to what keeps it for the conversation's next run (`keep_kernel`)."""

    async def shutdown(self) -> None: ...


@dataclass
class Question:
    """A question a run waits on (the `ask_user` tool of heron/proactive/ask.py): the AgentLoop
    answers it with the conversation's next message. Here, below both, so that neither imports
    the other."""

    run_id: str
    text: str
    reply: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    # The id of the queued message that answered (a worker's mail, heron/scale/): recorded
    # with the answer, so that the message's own workflow knows it was taken.
    ref: str | None = None

    def answer(self, text: str, ref: str | None = None) -> bool:
        if self.reply.done():
            return False
        self.ref = ref
        self.reply.set_result(text)
        return True


# Provenances of turns a person is behind: their message, a result of work they asked for, a
# goal they set. Any other turn (a scheduled job's, the heartbeat's, a subagent's) is background
# work: nobody answers its questions, and it starts no goal and creates no job.
PERSONAL = frozenset({"user", "announce", "goal"})


class RunningTurn(Protocol):
    """What tools use of the running turn (heron/agent/control.py's TurnControl)."""

    provenance: str  # who started the turn: "user", "reminder", "scheduled", "subagent", ...
    deliver: Callable[[str], Awaitable[str | None]] | None  # `message`'s outlet, its answer
    ask: Callable[[str], Awaitable[object]] | None  # `ask_user`'s outlet (kind "question")
    spoke: list[str]  # what the `message` tool delivered
    question: Question | None  # the question the run waits on

    @property
    def stale(self) -> bool:
        """Whether /stop or /new overtook the turn."""
        ...


class Spawner(Protocol):
    """What the `spawn` tool uses of heron/proactive/subagents.py's Subagents."""

    async def spawn(
        self,
        origin_key: str,
        task: str,
        *,
        tools: list[str] | None = None,
        resume: str | None = None,
        provenance: str = "user",
        wait: bool = False,
    ) -> Run: ...

    async def wait(self, run_id: str) -> Run: ...


class QuestionClock(Protocol):
    """What the `ask_user` tool uses of heron/proactive/ask.py's Asks: the clock it waits on."""

    def now(self) -> float: ...

    async def wait(self, store: Store, question: Question, seconds: float) -> tuple[str, str]: ...


@dataclass
class TurnServices:
    """The conversation a run belongs to, and the services of the process its tools reach."""

    store: Store | None = None
    conversation_id: int | None = None
    conversation_key: str | None = None
    # The id of the message the running turn answers: it and what follows it in the
    # conversation are in the model's view (recall_history leaves them out).
    turn_start: int | None = None
    # The conversation's rows that the latest request's view did not show whole (snipped to a
    # pointer, cut to head and tail): still the past to recall_history. None: none known.
    view_cuts: Callable[[], set[int]] | None = None
    agent: str = "default"  # work state, todos and the scratchpad are kept per agent
    turn: RunningTurn | None = None
    memory: MemoryService | None = None  # None when ephemeral
    recall: Recall | None = None  # built from the memory service's store when None
    # The `schedule` tool: the user's timezone, the home whose `heron serve` fires the jobs,
    # and this process's scheduler when one runs (told at once when a job is made).
    timezone: str | None = None
    home: Path | None = None
    jobs_changed: Callable[[], None] | None = None
    # Attached by heron/proactive to the engine, handed to each turn.
    subagents: Spawner | None = None
    asks: QuestionClock | None = None


@dataclass
class ReplyCount:
    """Changes asked for by one reply of the model (its tool calls run concurrently, some on
    threads): the memory tools refuse more than a few per reply."""

    reply: int | None = None
    count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


# The effects of the tool call running in this task (`ToolRegistry.call_recording`): calls of
# one reply run concurrently, each in its own task, so each sees only its own list.
_CALL_EFFECTS: ContextVar[list[JSONObject] | None] = ContextVar("call_effects", default=None)
# The id of the tool call running in this task (`ToolRegistry.call`): what a tool that leaves a
# record of its own (ask_user's run) names it by, so a reader finds that record from the call.
CALL_ID: ContextVar[str | None] = ContextVar("call_id", default=None)


async def recording(call: Awaitable[ToolResult]) -> tuple[ToolResult, list[JSONObject]]:
    """Await a tool call, with the side effects it records (`ToolContext.record_effect`)."""
    mine: list[JSONObject] = []
    token = _CALL_EFFECTS.set(mine)
    try:
        return await call, mine
    finally:
        _CALL_EFFECTS.reset(token)


@dataclass
class ToolContext:
    """What tools of one run share: the folder they are confined to and the services they use."""

    workspace: Path
    result_budget: int = 20_000
    effects: list[JSONObject] = field(default_factory=list)  # the whole run's
    kernel: RunSession | None = None
    # Takes the kernel back when the run ends, for the conversation's next run (a long-lived
    # process keeps one per conversation, heron/tools/python_kernel.py `Kernels`); None: the
    # kernel is shut down with the run.
    keep_kernel: Callable[[], Awaitable[None]] | None = None
    sandbox: Sandbox | None = None  # how commands run (heron/tools/sandbox.py); None: confined
    services: TurnServices = field(default_factory=TurnServices)
    # The channel's approver of commands when the sandbox cannot run (heron/tools/approval.py).
    approve: Approver | None = None
    # Tools that change the workspace run one at a time, so what one reports (a file changed)
    # is its own doing and not a concurrent call's.
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Scrubs every result before it is stored, saved or sent (heron/redact.py); None: as is.
    redactor: Redactor | None = None
    reply_seq: int = 0  # which reply of the run asked for the running calls (set by the runner)
    memory_changes: ReplyCount = field(default_factory=ReplyCount)
    # By call id, what a call stopped with its turn had produced so far (`leave_partial`):
    # the turn says it with the call's interrupted result.
    partials: dict[str, str] = field(default_factory=dict)
    # The scratchpad's folder (default: beside the workspace, per agent) and bounds.
    scratchpad: Path | None = None
    scratchpad_limits: tuple[int, int, int] = SCRATCHPAD_LIMITS

    @property
    def call_id(self) -> str | None:
        """The id of the tool call this task runs (None outside a call)."""
        return CALL_ID.get()

    def record_effect(self, effect: JSONObject) -> None:
        """A side effect of the running call: in the run's list and in the call's own."""
        self.effects.append(effect)
        mine = _CALL_EFFECTS.get()
        if mine is not None:
            mine.append(effect)

    def leave_partial(self, text: str) -> None:
        """What the running call had printed when its turn stopped it (called as it is
        cancelled; `text` within the result budget): scrubbed as a result is, and kept for its
        interrupted result."""
        call_id = self.call_id
        if call_id is None or not text.strip():
            return
        self.partials[call_id] = self.redactor.clean(text) if self.redactor else text

    async def aclose(self) -> None:
        """Release what the run started: the Python kernel is given back to its keeper, or
        shut down when there is none."""
        kernel, self.kernel = self.kernel, None
        keep, self.keep_kernel = self.keep_kernel, None
        if keep is not None:
            await keep()
        elif kernel is not None:
            await kernel.shutdown()
