"""Subagents on workers: a subagent's turn is a workflow of its own conversation on the queue.

In one process a subagent's turn runs in the loop that spawned it, which also times it out and
announces its result (heron/proactive/subagents.py). Across workers nothing may depend on the
worker that spawned it staying alive. So the `spawn` tool writes the run's row, as in one
process, and enqueues the task as the workflow of `subagent:<lineage>`; whichever worker
dequeues it runs the turn (a dead worker's is continued by another, like any turn), times it
out, records the run's result and enqueues the announcement into the origin conversation,
where it opens a turn of its own behind what waits there. The announcement's workflow id is
derived from the run's id, so a worker that dies between recording the result and enqueueing
it, and the worker that recovers the subagent's workflow and does it again, enqueue it once.
The run is marked announced once its result is answered in the origin, as in one process: an
announcement's turn that fails (a model error) leaves it unanswered, and one retry turn answers
it, enqueued under an id derived from the run (once, whichever worker sees the failure); when
that fails too the run stays owed, and the next turn there that ends well settles it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from heron.bus import InboundMessage
from heron.proactive import subagents as sa
from heron.store import runs

if TYPE_CHECKING:
    from heron.agent.engine import Engine
    from heron.agent.loop import TurnEnded
    from heron.store import Store

WAITED = "subagent_waited"  # meta of a task whose result the spawn call returns itself
POLL_S = 0.5  # how often a spawn that waits looks at the run's row


def announcement_id(run_id: str) -> str:
    """The workflow id of a run's announcement: the same for every worker that sends it."""
    return "announce-" + hashlib.sha256(run_id.encode()).hexdigest()[:24]


def task_run(message: InboundMessage) -> tuple[str, bool] | None:
    """(run id, whether the spawn waits for it) when `message` is a subagent's task."""
    meta = message.options.message_meta if message.options else None
    if not meta or not meta.get(sa.TASK_META):
        return None
    return str(meta[sa.TASK_META]), bool(meta.get(WAITED))


def retry_id(run_id: str) -> str:
    """The workflow id of the one turn that answers a run's result its announcement left
    unanswered: the same for every worker that enqueues it."""
    return "retry-" + hashlib.sha256(run_id.encode()).hexdigest()[:24]


def announced_run(message: InboundMessage) -> str | None:
    """The run whose result `message` carries into its origin (an announcement), or asks the
    origin to answer (the retry of one), if it is either."""
    meta = message.options.message_meta if message.options else None
    for name in (runs.RUN_META, sa.RETRY_META):
        if meta and meta.get(name):
            return str(meta[name])
    return None


class QueueingLoop(Protocol):
    """What the manager uses of the worker's loop (heron/scale/worker.py's WorkerLoop)."""

    engine: Engine
    origins: dict[str, tuple[str, str, str]]

    def start_turn(self, message: InboundMessage) -> None: ...


@dataclass
class QueuedSubagents:
    """The `spawn` tool's manager on a worker (`Spawner`): rows written here, turns queued."""

    loop: QueueingLoop
    poll_s: float = POLL_S

    @property
    def store(self) -> Store:
        return self.loop.engine.store

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
        sa.check_tools(self.loop.engine.registry.names(), tools)
        origin = self.loop.origins.get(origin_key, ("subagent", origin_key, provenance))
        run = await sa.open_run(self.store, origin_key, origin, task, tools, resume, provenance)
        self.loop.start_turn(sa.task_message(run, tools, meta={WAITED: wait}))
        return run

    async def wait(self, run_id: str) -> runs.Run:
        """Until the run has ended, on whichever worker ran it."""
        while True:
            run = await self.store.call(runs.get, self.store, run_id)
            if run is None:
                raise RuntimeError(f"subagent {run_id} is gone")
            if run.status not in ("running", "waiting"):
                return run
            await asyncio.sleep(self.poll_s)

    # ---- on the worker that runs the subagent's turn -------------------------------------

    async def finish(
        self, run_id: str, waited: bool, ended: TurnEnded | None, timed_out: bool
    ) -> None:
        """The turn of run `run_id` ended here, or (`ended` None) had ended before the worker
        that ran it died, and the run's row may already hold its end. Record the result from
        the transcript, as in one process, then announce it unless the spawn call returns it."""
        run = await self.store.call(runs.get, self.store, run_id)
        if run is None:
            return
        if run.status == "running":
            partial = await self.store.call(sa.partial_of, self.store, run)
            if timed_out:
                status, text, cut = "timed_out", partial, True
            elif ended is None:  # recovered after its end: what its transcript holds
                status, text, cut = "done", partial, False
            else:
                status, text, cut = sa.outcome_of(ended.result, partial)
            await self.store.call(runs.finish, self.store, run.id, status, text, partial=cut)
        if waited:
            await self.store.call(runs.mark_announced, self.store, run.id)
            return
        final = await self.store.call(runs.get, self.store, run_id)
        # Cancelled by the person (`heron runs cancel`): it does not report back.
        if final is not None and final.announced is None and final.status != "cancelled":
            message = sa.announcement(final, final.origin_channel, final.origin_chat)
            self.loop.start_turn(dataclasses.replace(message, id=announcement_id(run_id)))

    async def announced(self, run_id: str, ended: TurnEnded | None) -> None:
        """The turn of its announcement, or of that one's retry, ended here (`ended` None: it
        had ended before the worker running it died). Marked announced when the turn ended
        well or was stopped by the person (the next turn sees it), or the origin's record
        holds the result answered. A failed turn that left it unanswered is answered by one
        retry turn; when that one fails too, or the result never reached the record, the run
        stays owed (unmarked: `heron runs` shows it) for `settle_owed`."""
        run = await self.store.call(runs.get, self.store, run_id)
        if run is None or run.announced is not None:
            return
        if ended is not None and not sa.turn_failed(ended.end):
            await self.store.call(runs.mark_announced, self.store, run_id)
            return
        if not await self.store.call(runs.in_record, self.store, run.origin_key, run_id):
            return
        state = await self.store.call(sa.reply_state, self.store, run.origin_key, run_id)
        if state == "answered":
            await self.store.call(runs.mark_announced, self.store, run_id)
        elif state == "unanswered":
            channel, chat, _ = self.loop.origins.get(
                run.origin_key, (run.origin_channel, run.origin_chat, "")
            )
            retry = sa.retry_message(run, channel, chat)
            self.loop.start_turn(dataclasses.replace(retry, id=retry_id(run_id)))

    async def settle_owed(self, key: str) -> None:
        """A turn of `key` ended well: the results owed there that its record now holds
        answered are marked announced (one indexed read of the runs spawned there)."""
        for run in await self.store.call(runs.owed, self.store, key):
            if not await self.store.call(runs.in_record, self.store, key, run.id):
                continue  # not there yet: its announcement is still to run
            if await self.store.call(sa.reply_state, self.store, key, run.id) == "answered":
                await self.store.call(runs.mark_announced, self.store, run.id)


__all__ = ["QueuedSubagents", "announced_run", "announcement_id", "retry_id", "task_run"]
