"""Subagents: work the agent hands off with the `spawn` tool, run beside the conversation.

A subagent starts from a bare [system prompt, task]: it runs in a conversation of its own,
`subagent:<lineage>`, through the AgentLoop like any turn, with its own ceilings (model calls,
tokens, a wall-clock timeout) and without the tools that reach back into the conversation
(`spawn`, `ask_user`, `goal`, `message`, `schedule`). At most `max_parallel` run at once; the
others' rows say `waiting` until they get a slot (`runs.start`: running, the clock from then).

Its status row (heron/store/runs.py) is written before it starts. When it ends, its result goes
back to the conversation that spawned it as a user-role message authored by Heron and marked
with the run's id: into the running turn's mailbox if a turn runs there, else in an announce
turn of its own (visible where the person talks, silent when the origin was internal work).
The mark in the record is what makes the announcement happen exactly once: at start, and after
every turn of the origin, a result not yet in the record is announced (again), one already
there is only marked announced. A subagent that times out is stopped and returns what its
transcript holds, labelled partial.

Finished lineages are kept for `spawn(resume=...)` (3 per origin, 6 hours); `heron runs show`
prints a transcript. Their conversations are internal: never listed as conversations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heron.agent.turn import STOPPED, Injected
from heron.bus import InboundMessage, TurnEnd, TurnOptions
from heron.messages import Text, ToolCall, ToolResult
from heron.store import runs
from heron.store.engine_state import INTERRUPTED
from heron.tools.context import PERSONAL, Spawner, ToolContext
from heron.tools.registry import ToolOutput, tool

if TYPE_CHECKING:
    from heron.agent.engine import Engine, TurnResult
    from heron.agent.loop import AgentLoop, TurnEnded
    from heron.store import Store

log = logging.getLogger(__name__)

# The clock a timeout waits on (tests pass a fake).
Sleep = Callable[[float], Coroutine[Any, Any, None]]
MAX_PARALLEL = 4
MAX_MODEL_CALLS = 50
MAX_TOKENS = 400_000
TIMEOUT_S = 900.0
KEEP_LINEAGES = 3
KEEP_SECONDS = 6 * 3600.0
# Tools that reach back into the conversation: a subagent reports by its result only. No
# `schedule`: a job it made fired into its hidden conversation, and a reminder's subagent
# making jobs whose reminders spawned more made jobs breed with nobody involved.
WITHOUT = ("spawn", "ask_user", "goal", "message", "schedule")
PARTIAL_CHARS = 4_000
TASK_META = "subagent_task"  # meta of the row that opens a subagent's run with its task
RETRY_META = "subagent_retry"  # meta of the one turn that answers a result left unanswered
RETRY = (
    "[Heron: the turn that received subagent {run}'s result above was interrupted before it"
    " was answered] Answer that result now, as you would have then."
)


@dataclass
class Subagents:
    """The subagents of one AgentLoop: spawning, their timeouts, and announcing results."""

    loop: AgentLoop
    max_parallel: int = MAX_PARALLEL
    max_model_calls: int = MAX_MODEL_CALLS
    max_tokens: int = MAX_TOKENS
    timeout_s: float = TIMEOUT_S
    sleep: Sleep = asyncio.sleep
    tasks: dict[str, asyncio.Task[runs.Run]] = field(default_factory=dict)
    # Results on their way into an origin, by origin key: run id -> how ("mail": in a running
    # turn's mailbox; "turn": an announce turn of its own). Settled when a turn there ends.
    owed: dict[str, dict[str, str]] = field(default_factory=dict)
    # The channel and chat of this process (heron chat, heron run): where a result owed by an
    # earlier process is announced when its origin has not been heard from here yet.
    channel: tuple[str, str] | None = None
    waited: set[str] = field(default_factory=set)  # spawned with wait=True: given as a result
    _slots: asyncio.Semaphore | None = None
    _settling: set[asyncio.Task[None]] = field(default_factory=set)
    unwatch: Callable[[], None] = field(default=lambda: None, repr=False)  # drops its hook

    @property
    def store(self) -> Store:
        return self.loop.engine.store

    @property
    def busy(self) -> bool:
        return any(not t.done() for t in [*self.tasks.values(), *self._settling])

    # ---- start and spawn --------------------------------------------------------------------

    async def start(self, *, announce: bool = True) -> None:
        """Runs left open by a dead process are interrupted; with `announce`, every result not
        yet announced is announced now (once: one already in the origin's record is only
        marked). A one-message `heron run` leaves them for a chat to announce."""
        self._slots = asyncio.Semaphore(self.max_parallel)
        await self.store.call(runs.interrupt_orphans, self.store)
        if not announce:
            return
        for run in await self.store.call(runs.owed, self.store):
            if run.result is None:  # interrupted: what its transcript holds
                text = await self.store.call(partial_of, self.store, run)
                await self.store.call(runs.record_result, self.store, run.id, text, True)
                found = await self.store.call(runs.get, self.store, run.id)
                run = found if found is not None else run  # with its result, when still there
            await self.announce(run)

    async def spawn(
        self,
        origin_key: str,
        task: str,
        *,
        tools: list[str] | None = None,
        resume: str | None = None,
        provenance: str = "user",
        wait: bool = False,
    ) -> runs.Run:
        """Write the run's row, then start it; returns the row (status waiting until it has
        a slot, then running)."""
        check_tools(self.loop.engine.registry.names(), tools)
        origin = self.loop.origins.get(origin_key, ("subagent", origin_key, provenance))
        run = await open_run(
            self.store, origin_key, origin, task, tools, resume, provenance, status="waiting"
        )
        if wait:
            self.waited.add(run.id)
        self.tasks[run.id] = asyncio.create_task(self._run(run, tools, task))
        return run

    async def settle(self) -> None:
        """Until no subagent works and no announcement is being settled."""
        while pending := [t for t in [*self.tasks.values(), *self._settling] if not t.done()]:
            await asyncio.wait(pending)

    async def wait(self, run_id: str) -> runs.Run:
        """The run's row once it ended. A cancelled wait (a /stop of the turn that waits) stops
        the waiting, not the subagent: cancelling its task would free its slot while its turn
        went on, and leave its row running with its result lost. It ends in its slot instead,
        and its result is announced as a subagent's that nobody waits for."""
        try:
            return await asyncio.shield(self.tasks[run_id])
        except asyncio.CancelledError:
            self.waited.discard(run_id)
            raise

    # ---- one run ----------------------------------------------------------------------------

    async def _run(self, run: runs.Run, tools: list[str] | None, task: str) -> runs.Run:
        slots = self._slots or asyncio.Semaphore(self.max_parallel)
        self._slots = slots
        async with slots:  # waiting (so its row says) until a slot is free
            started = await self.store.call(runs.start, self.store, run.id)
            if started:  # else cancelled while it waited: it never runs
                status, text, partial = await self._drive(run, tools, task)
        ended = started and await self.store.call(
            runs.finish, self.store, run.id, status, text, partial=partial
        )
        if run.id in self.waited:  # the spawn call returns it as its tool result
            await self.store.call(runs.mark_announced, self.store, run.id)
        final: runs.Run | None = await self.store.call(runs.get, self.store, run.id)
        assert final is not None  # finished just above; runs are never deleted
        if ended and run.id not in self.waited:
            await self.announce(final)
        return final

    async def _drive(
        self, run: runs.Run, tools: list[str] | None, task: str
    ) -> tuple[str, str, bool]:
        key = run.conversation_key
        assert key is not None
        message = task_message(run, tools, self.max_model_calls, self.max_tokens)
        turn = asyncio.create_task(self.loop.run_turn(message))
        timer = asyncio.create_task(self.sleep(self.timeout_s))
        try:
            done, _ = await asyncio.wait({turn, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        if turn not in done:  # the wall clock ran out: stop it, keep what it did
            await self.loop.stop(key)
            with contextlib.suppress(BaseException):
                await turn
            text = await self.store.call(partial_of, self.store, run)
            return "timed_out", text, True
        result = turn.result() if turn.exception() is None else None
        return outcome_of(result, await self.store.call(partial_of, self.store, run))

    # ---- announcing -------------------------------------------------------------------------

    async def announce(self, run: runs.Run | None) -> None:
        """Carry a finished run's result into its origin, unless the record already has it."""
        if run is None or run.announced is not None:
            return
        if await self.store.call(runs.in_record, self.store, run.origin_key, run.id):
            # Stored by a turn a dead process never finished: answered once more, then marked.
            state = await self.store.call(reply_state, self.store, run.origin_key, run.id)
            if state == "unanswered":
                self._retry(run)
            elif state == "answered":
                await self._announced(run)
            else:  # its one retry failed too: owed until a turn there answers it
                self.owed.setdefault(run.origin_key, {})[run.id] = "left"
            return
        channel, chat = run.origin_channel, run.origin_chat
        if run.origin_key in self.loop.origins:
            channel, chat, _ = self.loop.origins[run.origin_key]
        elif self.channel is not None:
            channel, chat = self.channel
        message = announcement(run, channel, chat)
        meta = message.options.message_meta if message.options else None
        how = self.loop.announce(message, Injected(message.text, meta or {}))
        self.owed.setdefault(run.origin_key, {})[run.id] = how

    def _retry(self, run: runs.Run) -> None:
        """The one turn that answers a result its announce turn never answered (the record's
        RETRY_META row makes it one, also across a crash); settled when it ends."""
        channel, chat, _ = self.loop.origins.get(
            run.origin_key, (run.origin_channel, run.origin_chat, "")
        )
        if run.origin_key not in self.loop.origins and self.channel is not None:
            channel, chat = self.channel
        self.loop.start_turn(retry_message(run, channel, chat))
        self.owed.setdefault(run.origin_key, {})[run.id] = "retry"

    async def _announced(self, run: runs.Run) -> None:
        await self.store.call(runs.mark_announced, self.store, run.id)
        self.owed.get(run.origin_key, {}).pop(run.id, None)
        for lineage in await self.store.call(
            runs.expired_lineages, self.store, run.origin_key, KEEP_LINEAGES, KEEP_SECONDS
        ):
            await self.store.call(runs.forget_lineage, self.store, lineage)

    def turn_ended(self, ended: TurnEnded) -> None:
        """The loop's end-of-turn hook: settle what this conversation was owed."""
        if not self.owed.get(ended.key):
            return
        end = ended.end
        outcome = "failed" if turn_failed(end) else end.outcome
        task = asyncio.create_task(self._settle(ended.key, ended.message, outcome))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, key: str, ended: InboundMessage, outcome: str = "delivered") -> None:
        meta = ended.options.message_meta if ended.options else None
        ended_run = (meta or {}).get(runs.RUN_META)
        for run_id, how in list(self.owed.get(key, {}).items()):
            run = await self.store.call(runs.get, self.store, run_id)
            if run is None:
                continue
            if await self.store.call(runs.in_record, self.store, key, run_id):
                if outcome == "failed":  # a /stop is the person's: the next turn sees it
                    state = await self.store.call(reply_state, self.store, key, run_id)
                    if state == "unanswered" and how != "retry":
                        if not (self.loop.running(key) or self.loop.pending(key)):
                            self._retry(run)
                        continue  # else the turn waiting there answers it
                    if state != "answered":  # its one retry failed too: left owed
                        self.owed.setdefault(key, {})[run_id] = "left"
                        continue
                await self._announced(run)
            elif how == "mail" or run_id == ended_run:
                # Left unread in a mailbox, or its own turn ended before storing it: again.
                await self.announce(run)

    async def close(self) -> None:
        """Before the loop closes: runs still working are stopped and recorded interrupted
        with what they did (announced at the next start, never lost)."""
        self.unwatch()
        open_runs = [rid for rid, task in self.tasks.items() if not task.done()]
        for task in list(self.tasks.values()):
            task.cancel()
        for ending in [*self.tasks.values(), *self._settling]:
            with contextlib.suppress(BaseException):
                await ending
        for run_id in open_runs:
            run = await self.store.call(runs.get, self.store, run_id)
            if run is not None and run.conversation_key:
                await self.loop.stop(run.conversation_key)
                text = await self.store.call(partial_of, self.store, run)
                await self.store.call(
                    runs.finish, self.store, run_id, "interrupted", text, partial=True
                )


def outcome_of(result: TurnResult | None, partial: str) -> tuple[str, str, bool]:
    """A finished turn as a run's status, result text and whether it is partial."""
    if result is None:
        return "failed", partial or "(the subagent's turn failed before it answered)", True
    if result.run.error is not None:
        note = f"The subagent failed: {result.run.error}"
        return "failed", f"{note}\n\n{partial}" if partial else note, True
    if result.run.stop == "wrapup":  # it reached its ceiling and summed up
        return "done", result.run.text or partial, True
    return "done", result.run.text or partial, False


def partial_of(store: Store, run: runs.Run) -> str:
    """What a subagent's transcript holds of its work since its task: its replies, each tool
    call it made (name and first argument) with the start of its result, and the call that was
    running when it was stopped, bounded. Heron's own stopped-turn reply says nothing of the
    work and is left out: an interrupted run's result was that line alone."""
    key = run.conversation_key
    conv = store.conversation(key) if key else None
    if conv is None:
        return ""
    rows = store.branch(conv.id)
    start = max((i for i, r in enumerate(rows) if r.meta.get(TASK_META)), default=0)
    pieces: list[str] = []
    calls: dict[str, ToolCall] = {}
    unanswered: list[str] = []  # call ids without a result yet, in order
    for row in rows[start + 1 :]:
        for part in row.message.parts:
            if isinstance(part, Text) and row.message.role == "assistant" and part.text.strip():
                if part.text.strip() != STOPPED:
                    pieces.append(part.text.strip())
            elif isinstance(part, ToolCall):
                calls[part.id] = part
                unanswered.append(part.id)
            elif isinstance(part, ToolResult):
                pieces.append(_tool_line(calls.get(part.call_id), part))
                if part.call_id in unanswered:
                    unanswered.remove(part.call_id)
    pieces += [f"[tool] {_call_label(calls[i])} {IN_FLIGHT}" for i in unanswered]
    text = "\n\n".join(pieces)
    return text if len(text) <= PARTIAL_CHARS else "…" + text[-PARTIAL_CHARS:]


IN_FLIGHT = "was running when it was stopped"
RESULT_CHARS = 300  # of each tool result, in a partial result
ARG_CHARS = 80  # of a call's first argument there


def _call_label(call: ToolCall | None) -> str:
    """`bash(command='ls -la')`: the tool and its first argument, shortened."""
    if call is None:
        return "a tool call"
    if not call.args:
        return f"{call.name}()"
    name, value = next(iter(call.args.items()))
    shown = value if isinstance(value, str) else str(value)
    if len(shown) > ARG_CHARS:
        shown = shown[: ARG_CHARS - 1] + "…"
    more = ", …" if len(call.args) > 1 else ""
    return f"{call.name}({name}={shown!r}{more})"


def _tool_line(call: ToolCall | None, result: ToolResult) -> str:
    """One call and what came of it: its result's start, that it failed, or that it was still
    running when the turn was stopped (with what it had printed)."""
    label = _call_label(call)
    content = result.content
    if result.is_error and content.startswith(INTERRUPTED):
        printed = content[len(INTERRUPTED) :].lstrip(". ")
        return f"[tool] {label} {IN_FLIGHT}" + (f"; {printed[:RESULT_CHARS]}" if printed else "")
    how = "failed: " if result.is_error else "-> "
    return f"[tool] {label} {how}{content[:RESULT_CHARS]}"


def reply_state(store: Store, origin_key: str, run_id: str) -> str:
    """Whether the run's result in the origin's record was answered: "answered" (a final
    reply, a model message without tool calls, follows it, or it is not there), "unanswered",
    or "retried" (unanswered, and its one retry turn has been opened already)."""
    conv = store.conversation(origin_key)
    rows = [] if conv is None else store.branch(conv.id)
    at = [i for i, r in enumerate(rows) if r.meta.get(runs.RUN_META) == run_id]
    if not at:
        return "answered"
    after = rows[at[-1] + 1 :]
    if any(r.message.role == "assistant" and not r.message.tool_calls for r in after):
        return "answered"
    return "retried" if any(r.meta.get(RETRY_META) == run_id for r in after) else "unanswered"


_STATUS = {
    "done": "finished",
    "failed": "failed",
    "timed_out": "timed out",
    "interrupted": "was interrupted (Heron stopped while it ran)",
}


def result_message(run: runs.Run) -> str:
    """The message that carries a run's result into its origin."""
    label = " (partial: what it had when it stopped)" if run.partial else ""
    head = (
        f"[Subagent result, not written by the user] Subagent {run.id} (lineage {run.lineage},"
        f" resume with spawn(resume={run.lineage!r})) {_STATUS.get(run.status, run.status)}{label}."
    )
    body = run.result or "(no output)"
    return f"{head}\nTask: {run.task}\n\n{body}"


def check_tools(offered: list[str], tools: list[str] | None) -> None:
    """A clear error when a spawn names a tool its subagent cannot have."""
    from heron.errors import ToolError

    allowed = [n for n in offered if n not in WITHOUT]
    unknown = sorted(set(tools or ()) - set(allowed))
    if unknown:
        raise ToolError(
            f"a subagent cannot have {', '.join(unknown)}; it may use: {', '.join(allowed)}"
        )


async def open_run(
    store: Store,
    origin_key: str,
    origin: tuple[str, str, str],
    task: str,
    tools: list[str] | None,
    resume: str | None,
    provenance: str,
    *,
    status: str = "running",
) -> runs.Run:
    """The run's row, written before its work starts: a new lineage, or the finished one
    `resume` names, restarted with the new task. `origin`: (channel, chat, provenance) of the
    turn that spawns it. `status`: "waiting" where it may wait for a slot (`runs.start` makes
    it running when it gets one)."""
    if resume:
        return await _resume(store, resume, origin_key, task, status)
    channel, chat, _ = origin
    return await store.call(
        runs.create,
        store,
        f"sa_{secrets.token_hex(6)}",
        "subagent",
        origin_key,
        task,
        status=status,
        lineage=secrets.token_hex(4),
        tools=tools,
        origin_channel=channel,
        origin_chat=chat,
        origin_internal=provenance not in PERSONAL,
    )


async def _resume(
    store: Store, lineage: str, origin_key: str, task: str, status: str = "running"
) -> runs.Run:
    from heron.errors import ToolError

    run = await store.call(runs.by_lineage, store, lineage)
    if run is None or run.origin_key != origin_key:
        raise ToolError(
            f"no subagent lineage {lineage!r} to resume from this conversation "
            "(finished lineages are kept 6 hours, 3 per conversation); spawn a new one"
        )
    if run.status in ("running", "waiting"):
        raise ToolError(f"subagent {run.id} of lineage {lineage!r} is still {run.status}")
    await store.call(runs.restart, store, run.id, status)
    await store.call(runs.set_task, store, run.id, task)
    restarted = await store.call(runs.get, store, run.id)
    if restarted is None:  # deleted in between (another process): nothing to continue
        raise ToolError(f"subagent {run.id} of lineage {lineage!r} is gone")
    return restarted


def task_message(
    run: runs.Run,
    tools: list[str] | None,
    max_model_calls: int = MAX_MODEL_CALLS,
    max_tokens: int = MAX_TOKENS,
    meta: dict[str, Any] | None = None,
) -> InboundMessage:
    """The message that opens a subagent's turn in its own conversation: its task, its
    ceilings and tools."""
    key = run.conversation_key
    assert key is not None
    options = TurnOptions(
        max_model_calls=max_model_calls,
        max_tokens=max_tokens,
        tools=tuple(tools) if tools is not None else None,
        without=WITHOUT,
        # The task is the main agent's words, not the person's: authored by Heron, so no
        # memory pass ever quotes it; and no recall into it (it sees only its task).
        message_meta={"subagent": True, TASK_META: run.id, **(meta or {})},
        bare=True,
    )
    return InboundMessage(
        "subagent", run.lineage or "", run.task, key, provenance="subagent", options=options
    )


def turn_failed(end: TurnEnd) -> bool:
    """Whether a turn failed: it raised, or ended on a model error (ok False, error set), which
    leaves the result it received as unanswered; not a turn the person stopped (stale)."""
    return end.outcome == "failed" or (
        not end.ok and end.error is not None and end.outcome != "stale"
    )


def retry_message(run: runs.Run, channel: str, chat: str) -> InboundMessage:
    """The message of the one turn that answers a result its announce turn never answered; its
    RETRY_META row in the record makes it one (`reply_state` says "retried" after it)."""
    meta = {"synthetic": True, "subagent": True, RETRY_META: run.id}
    return InboundMessage(
        channel,
        chat,
        RETRY.format(run=run.id),
        run.origin_key,
        provenance="subagent" if run.origin_internal else "announce",
        options=TurnOptions(message_meta=meta),
    )


def announcement(run: runs.Run, channel: str, chat: str) -> InboundMessage:
    """The message that carries a finished run's result into its origin conversation."""
    meta = {"subagent": True, runs.RUN_META: run.id}
    return InboundMessage(
        channel,
        chat,
        result_message(run),
        run.origin_key,
        provenance="subagent" if run.origin_internal else "announce",
        options=TurnOptions(message_meta=meta),
    )


# ---- the tool -------------------------------------------------------------------------------


@tool
async def spawn(
    ctx: ToolContext,
    task: str,
    tools: list[str] | None = None,
    wait: bool = False,
    resume: str | None = None,
) -> str | ToolOutput:
    """Hand a self-contained task to a subagent that works on it beside this conversation.

    The subagent sees only the task (not this conversation): say everything it needs. Its
    result comes back to this conversation as a message when it finishes; you do not need to
    wait or poll. At most 4 run at once.

    Args:
        task: The complete instructions, with every path, name and value the work needs.
        tools: Names of the only tools it may use (default: all but spawn, ask_user, goal,
            message, schedule).
        wait: Wait for its result and get it as this tool's result instead of a message.
        resume: A finished subagent's lineage id, to continue its work with this new task.
    """
    manager, origin = ctx.services.subagents, ctx.services.conversation_key
    if manager is None or origin is None:
        return ToolOutput("Subagents are not available in this run; do the work yourself.", True)
    turn = ctx.services.turn
    provenance = turn.provenance if turn is not None else "user"
    run = await manager.spawn(
        origin, task, tools=tools, resume=resume, provenance=provenance, wait=wait
    )
    if not wait:
        return (
            f"Started subagent {run.id} (lineage {run.lineage}). Its result will arrive in this "
            "conversation as a message when it finishes."
        )
    return result_message(await manager.wait(run.id))


def attach(loop: AgentLoop, **settings: Any) -> Subagents:
    """Subagents for this loop: the `spawn` tool in its engine's registry, the manager where
    the tool finds it, and the loop's turn ends settling announcements."""
    manager = Subagents(loop, **settings)
    offer_spawn(loop.engine, manager)
    manager.unwatch = loop.watch_turns(manager.turn_ended)
    return manager


def offer_spawn(engine: Engine, manager: Spawner) -> None:
    """The `spawn` tool in the engine's registry (unless its tools are none at all), and the
    manager where it finds what to do."""
    engine.attached.subagents = manager
    if engine.registry.get("spawn") is None and engine.registry.names():
        engine.registry.add(spawn)
