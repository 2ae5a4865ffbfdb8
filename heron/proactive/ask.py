"""Questions that wait: the `ask_user` tool parks the run until the person answers.

The question is delivered at once (like the `message` tool) and recorded as a run of kind
`ask` (heron/store/runs.py) with its deadline. The run stays where it asked, holding its
conversation: the next message the person sends there is the answer (the AgentLoop hands it to
the waiting question instead of the mailbox) and the tool returns it, so the run resumes from
that very call. Past the deadline, or when the person drops it (`heron runs cancel RUN`), the
tool says so and the run ends with what it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heron.store import Store, runs
from heron.store.records import ANSWERED
from heron.tools.context import PERSONAL, Question, ToolContext
from heron.tools.registry import ToolOutput, tool

if TYPE_CHECKING:
    from heron.agent.loop import AgentLoop

Sleep = Callable[[float], Coroutine[Any, Any, None]]
DEFAULT_MINUTES = 60.0
MAX_MINUTES = 7 * 24 * 60.0
POLL_S = 1.0  # how often a waiting question looks for a cancel from another process (one row)


@dataclass
class Asks:
    """The clock questions wait on (tests pass a fake) and how often they look for a cancel."""

    sleep: Sleep = asyncio.sleep
    now: Callable[[], float] = time.time
    poll_s: float = POLL_S

    async def wait(self, store: Store, question: Question, seconds: float) -> tuple[str, str]:
        """Until answered, past the deadline, or cancelled: (status, answer or '')."""
        deadline = asyncio.create_task(self.sleep(seconds))
        cancelled = asyncio.create_task(self._cancelled(store, question.run_id))
        waits: set[asyncio.Future[Any]] = {question.reply, deadline, cancelled}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (deadline, cancelled):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if question.reply in done:
            return "answered", question.reply.result()
        return ("cancelled", "") if cancelled in done else ("expired", "")

    async def _cancelled(self, store: Store, run_id: str) -> None:
        while True:
            await self.sleep(self.poll_s)
            run = await store.call(runs.get, store, run_id)
            if run is None or run.status == "cancelled":
                return


@tool
async def ask_user(
    ctx: ToolContext, question: str, minutes: float = DEFAULT_MINUTES
) -> str | ToolOutput:
    """Ask the user a question and wait for the answer before going on.

    Use it only when you cannot go on without the user's decision or information. The question
    is shown at once; the user's next message is the answer, returned here. If no answer comes
    before the deadline, finish with what you have.

    Args:
        question: The question, complete enough to answer without context.
        minutes: How long to wait for the answer (default 60; at most a week).
    """
    turn, store, key = ctx.services.turn, ctx.services.store, ctx.services.conversation_key
    asks = ctx.services.asks or Asks()
    deliver = turn.ask if turn is not None else None
    if turn is None or store is None or key is None or deliver is None:
        return ToolOutput("No one can answer in this run; decide yourself and say so.", True)
    if turn.provenance not in PERSONAL:
        return ToolOutput("This is background work: no one is here to answer. Decide.", True)
    minutes = min(max(minutes, 0.0), MAX_MINUTES)
    run = await store.call(
        runs.create,
        store,
        f"ask_{secrets.token_hex(6)}",
        "ask",
        key,
        question,
        status="waiting",
        deadline=asks.now() + minutes * 60,
        call_id=ctx.call_id,
    )
    pending = Question(run.id, question)
    turn.question = pending
    try:
        await deliver(f"{question}\n{waiting_line(minutes, run.id)}")
        status, answer = await asks.wait(store, pending, minutes * 60)
    except asyncio.CancelledError:
        # /stop, /new or shutdown ended the turn: nobody waits for the answer any more (a
        # long-lived serve would else list the question as waiting until its deadline).
        await store.call(runs.finish, store, run.id, "interrupted", None)
        raise
    finally:
        turn.question = None
    await store.call(runs.finish, store, run.id, status, answer or None, answered_by=pending.ref)
    if status == "answered":
        return ANSWERED + answer
    if status == "cancelled":
        return "The user dropped the question. Do not ask it again; finish with what you have."
    return (
        f"No answer within {minutes:g} minutes. Do not ask again now; finish with what you have "
        "and say what is still open."
    )


def waiting_line(minutes: float, run_id: str) -> str:
    """What follows the question on every client: how long the run waits, and its id (for
    `heron runs cancel`). Where and how to answer is each client's to say: the next line typed
    in a chat, the message box of a browser, another client for a script."""
    span = "1 minute" if minutes == 1 else f"{minutes:g} minutes"
    return f"(Waiting up to {span} for your answer. Run {run_id}.)"


def attach(loop: AgentLoop, **settings: Any) -> Asks:
    """Questions for this loop: the `ask_user` tool and the clock it waits on."""
    engine = loop.engine
    asks = Asks(**settings)
    engine.attached.asks = asks
    if engine.registry.get("ask_user") is None and engine.registry.names():
        engine.registry.add(ask_user)
    return asks
