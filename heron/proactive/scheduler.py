"""The scheduler: fires due jobs as ordinary turns through the AgentLoop.

Each wake it asks the store which jobs are due (`heron.store.jobs.claim_due`, one transaction
that decides fire or skip, records it in `job_runs`, advances the job and leases it to this
process), then publishes one InboundMessage per fire on the bus, channel "schedule": the loop's
one-turn-per-conversation queue runs it after whatever turn is running there, never inside it.

- reminder: a visible turn in the conversation the job was made in (provenance "reminder").
- monitor: a silent turn in `cron:<id>` (provenance "scheduled"); it reaches the user only if
  the agent calls `message`, whose delivery carries the job's conversation as its chat. Its
  conversation is bounded as the heartbeat's is: once it holds `tail_turns` checks since its
  last separator, the next check writes one and carries the last check's closing note
  (`TurnOptions.fresh_after`, applied by the turn under its own lease). On a model offered no
  tools it could never speak, so its fires are recorded skipped (`NO_TOOLS`) and run no turn.

- review: the built-in job of the nightly review of memory (heron/proactive/review.py). It is
  no turn: the scheduler runs the pass itself (`review`, given by whoever wires it), after the
  same claim, lease and catch-up as every job. While a turn the person started runs, the fire
  is recorded skipped and tried again `IDLE_RETRY_S` later (a run-now, `heron jobs run-now`,
  is only skipped: its schedule stays as it was).

At its start (`recover`) it marks interrupted the runs a scheduler that is gone left running
(kill -9, a crash), and fires once more, late and saying so, a job whose run was cut off before
its turn ended, so a one-shot reminder cut by a restart still arrives; a cut-off review tries
again `IDLE_RETRY_S` later. A scheduler that keeps running does the same on the tick after
another one of the home dies or stops mid-run (a second serve's): each tick looks, with one
indexed read. A one-shot reminder that will not arrive (skipped past the grace,
or cut off and not run again) is said in its conversation, as a Heron-authored row.

The scheduler watches the loop's turn ends (`AgentLoop.watch_turns`) to record each run's
outcome and give the job's lease back. It sleeps until the next instant, or at most
`poll_s` (jobs made by `heron jobs add` in another process), or until the `schedule` tool in
this process wakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from heron.agent.loop import AgentLoop, TurnEnded
from heron.agent.relay import move_in
from heron.bus import InboundMessage, MessageBus, OutboundMessage, Provenance, TurnOptions
from heron.errors import one_line
from heron.proactive.clock import Clock
from heron.store import Store, waiting
from heron.store import jobs as js
from heron.store.engine_state import HOST
from heron.store.schedule import user_timezone
from heron.timefmt import when

log = logging.getLogger(__name__)

CHANNEL = "schedule"
POLL_S = 30.0  # a job saved by another process is seen within this
GRACE_S = 6 * 3600.0  # catch_up "once": a missed instant older than this is skipped
REMINDER = "[Scheduled reminder, job {id}. The user asked for this earlier; tell them now.]"
MONITOR = (
    "[Scheduled check, job {id}. This runs in the background: nothing you write reaches the "
    "user unless you call the message tool. Call it only if there is something they must "
    "hear; otherwise end with a short note of what you found.]"
)
# Said in a reminder's conversation when it will not come; its prompt follows.
NOT_DELIVERED = "[Scheduled reminder, job {id}, due {due}, not delivered: {why}. It said:]"
# Said once when a reminder's runs start failing (not at every failed run: a job every minute
# against a model that is down would fill its conversation), and again after a success.
FAILING = (
    "[Scheduled reminder, job {id}: its run failed ({why}). It is tried again at its next "
    "time; nothing more is said here while it keeps failing (heron jobs runs {id} lists every "
    "run).]"
)
WHY_CHARS = 300  # of the error, in that note
# Why a monitor's fire (and a heartbeat's tick) is skipped on a model offered no tools: its
# turn is silent unless it calls `message`, so running it would cost a model call and end
# "silent" every time, whatever it found.
NO_TOOLS = "the model in use has no tools: it cannot message you"
_OUTCOMES = {"delivered", "spoke_via_tool", "silent"}
TAIL_TURNS = 8  # checks a monitor's (and the heartbeat's) model sees, at most, before afresh
IDLE_RETRY_S = 30 * 60.0  # a review skipped for a running turn of the person's tries again then


@dataclass
class Scheduler:
    store: Store
    bus: MessageBus
    clock: Clock
    grace_s: float = GRACE_S
    poll_s: float = POLL_S
    tail_turns: int = TAIL_TURNS
    owner: str = field(default_factory=lambda: f"{HOST}:{os.getpid()}:{secrets.token_hex(4)}")
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    fired: int = 0  # publishes so far (the benchmark reads it)
    _open: set[int] = field(default_factory=set)  # runs whose turns have not ended
    # Removes its end-of-turn hook from the loop it watches (`watch`).
    unwatch: Callable[[], None] = field(default=lambda: None, repr=False)
    # The built-in review job: the pass (returns its one-line report) and the idle rule (a
    # turn the person started runs now). Without `review` a fire of it is recorded failed.
    review: Callable[[], Awaitable[str]] | None = field(default=None, repr=False)
    user_busy: Callable[[], bool] = field(default=lambda: False, repr=False)
    _passes: set[asyncio.Task[None]] = field(default_factory=set, repr=False)
    # Only jobs of these modes (a `heron chat` without serve runs the built-in review alone).
    modes: tuple[str, ...] | None = None
    # The model in use is offered tools (`engine.offers_tools`): else monitors are skipped.
    tools: bool = True
    # The model in use reads a brief prompt (its profile's `brief_prompt`: the tiny offline
    # one): a reminder reaches it as the person's own words alone, without Heron's bracketed
    # wrapper, which such a model takes for the question (qa24c L5: 3 of 3 replies off topic).
    brief: bool = False
    # The agent's zone (`Settings.timezone`): the times a run's note and a reminder's "not
    # delivered" say are in it, as every time Heron shows, whatever zone a cron job reads its
    # own times in (qa24e M1). Left out (tests): the system's.
    zone: str = field(default_factory=lambda: user_timezone(None))

    def watch(self, loop: AgentLoop) -> None:
        """Record outcomes as the loop's turns end."""
        self.unwatch = loop.watch_turns(self.turn_ended)

    async def drain(self) -> None:
        """Until the review passes this scheduler started have ended (tests, benchmarks)."""
        while self._passes:
            await asyncio.gather(*self._passes, return_exceptions=True)

    def poke(self) -> None:
        self.wake.set()

    async def run(self) -> None:
        try:
            await self.recover()
            while True:
                await self.tick()
                await self.clock.sleep_until(await self._deadline(), self.wake)
                self.wake.clear()
        finally:
            for task in self._passes:
                task.cancel()
            for task in list(self._passes):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.release()

    async def recover(self) -> int:
        """At start: close the runs of schedulers that are gone, fire once more the jobs
        whose runs were cut off, and tell the conversations of reminders that will not come;
        returns how many were fired again."""
        now = self.clock.now()
        found = await self.store.call(
            js.recover, self.store, self.owner, os.getpid(), now, self.grace_s,
            review_again=now + IDLE_RETRY_S, modes=self.modes, zone=self.zone,
        )  # fmt: skip
        for fire in found.fires:
            await self._publish(fire)
        await self._tell(found.lost)
        return len(found.fires)

    async def tick(self) -> int:
        """Fire (or skip) everything due now; returns how many were fired."""
        now = self.clock.now()
        fired = await self._recover_left(now)
        while True:
            lost: list[js.Lost] = []
            batch = await self.store.call(
                js.claim_due, self.store, self.owner, os.getpid(), now, self.grace_s,
                modes=self.modes, lost=lost, zone=self.zone,
            )  # fmt: skip
            for fire in batch:
                await self._publish(fire)
            await self._tell(lost)
            fired += len(batch)
            if len(batch) < js.CLAIM_BATCH:  # a short batch: nothing due is left
                break
        if self._open:
            await self.store.call(js.renew_leases, self.store, self.owner, now)
        return fired

    async def fire_asked(self, job_id: int) -> bool:
        """Fire job `job_id`'s asked run (`js.request_run`) now, whatever else is due: what
        `heron jobs run-now` does in its own process when no serve runs. False when another
        scheduler took it first; `drain` and the loop's settling wait for its end."""
        now = self.clock.now()
        fire = await self.store.call(
            js.claim_asked, self.store, job_id, self.owner, os.getpid(), now, self.grace_s,
            self.zone,
        )  # fmt: skip
        if fire is None:
            return False
        await self._publish(fire)
        return True

    async def _recover_left(self, now: float) -> int:
        """What another scheduler of this home left when it died or stopped mid-run (a second
        serve's, killed), recovered as a start recovers it, by this one that keeps running:
        otherwise only the next start would, and a reminder cut off there would wait for it.
        One indexed read per tick (`js.left_to_recover`); returns how many were fired again."""
        left = await self.store.call(js.left_to_recover, self.store, now, self.modes)
        return await self.recover() if left else 0

    async def _deadline(self) -> float:
        now = self.clock.now()
        due = await self.store.call(js.next_due, self.store, unleased=True, modes=self.modes)
        latest = now + self.poll_s
        return latest if due is None else max(min(due, latest), now)

    async def _publish(self, fire: js.Fire) -> None:
        job = fire.job
        if job.builtin:
            self._open.add(fire.run_id)
            self.fired += 1
            log.info("job %s fired (the nightly review)", job.id)
            task = asyncio.create_task(self._review(fire))
            self._passes.add(task)
            task.add_done_callback(self._passes.discard)
            return
        if job.mode == "monitor" and not self.tools:
            await self._skip(fire, NO_TOOLS)
            return
        template = MONITOR if job.mode == "monitor" else REMINDER
        provenance: Provenance = "scheduled" if job.mode == "monitor" else "reminder"
        header = template.format(id=job.id)
        if fire.detail:
            header += f"\n[{fire.detail}]"
        text = job.prompt if self.brief and job.mode == "reminder" else f"{header}\n{job.prompt}"
        meta = {"job": str(job.id), js.RUN_META: str(fire.run_id), "owner": self.owner}
        if job.mode == "monitor":
            meta["deliver_to"] = job.conversation  # where its `message` reaches the user
            meta["deliver_as"] = f"scheduled job {job.id} (a monitor)"  # its label there
        message = InboundMessage(
            CHANNEL,
            job.conversation,
            text,
            key=job.key,
            provenance=provenance,
            agent=job.agent,
            meta=meta,
            # A reminder is seen as it is written, like any visible turn; a monitor shows
            # nothing at all, not even that it ran.
            events=job.mode == "reminder",
            # Its stored message names the run, so a start after a crash knows whether the
            # turn ended (`js.recover`); still Heron's, never the person's words. A monitor's
            # conversation is bounded (`fresh_after`: the module's docstring).
            options=TurnOptions(
                message_meta={
                    "injected_event": provenance,
                    "job": job.id,
                    js.RUN_META: str(fire.run_id),
                },
                fresh_after=self.tail_turns if job.mode == "monitor" else None,
                # A conversation the fire opens is titled with what the person asked for,
                # never with Heron's wrapper ("[Scheduled reminder, job 7...").
                title=job.prompt,
            ),
        )
        self._open.add(fire.run_id)
        self.fired += 1
        log.info("job %s fired (%s) in %s", job.id, job.mode, job.key)
        await self.bus.publish(message)

    async def _skip(self, fire: js.Fire, why: str) -> None:
        """The fire recorded skipped for `why`, with no turn; its job keeps its schedule."""
        log.info("job %s skipped: %s", fire.job.id, why)
        await self.store.call(
            js.finish_run, self.store, fire.run_id, status="skipped", outcome="skipped",
            now=self.clock.now(), detail=why,
        )  # fmt: skip
        self.wake.set()

    def turn_ended(self, ended: TurnEnded) -> None:
        """A loop's turn ended; if it was one of this scheduler's fires, record how (one
        short write, on the loop)."""
        meta, end = ended.message.meta, ended.end
        if meta.get("owner") != self.owner:
            return
        run_id = int(meta["job_run"])
        self._open.discard(run_id)
        if end.ok and end.outcome in _OUTCOMES:
            status, outcome, detail = "done", end.outcome, None
        elif end.outcome == "stale":
            status, outcome, detail = "interrupted", "stopped", "stopped before it finished"
        else:
            status, outcome, detail = "failed", "failed", end.error
        js.finish_run(
            self.store,
            run_id,
            status=status,
            outcome=outcome,
            now=self.clock.now(),
            detail=detail,
        )
        self.wake.set()  # the job's lease is free: an instant missed meanwhile is due now
        if status == "failed" and ended.message.provenance == "reminder":
            self._failed(int(meta["job"]), run_id, detail or "no reason given")

    def _failed(self, job_id: int, run_id: int, why: str) -> None:
        """A reminder's run failed: said in its conversation when it begins a run of failures,
        to whoever has it open and, kept there, to whoever opens it later. It is the one report
        of the streak: the failed turn itself shows no error (`turn.save`), so nobody hears
        it twice, nor again at each later failure."""
        job = js.get_job(self.store, job_id)
        if job is None or not js.starts_failing(self.store, job_id, run_id):
            return
        why = " ".join(one_line(why).split())[:WHY_CHARS]
        task = asyncio.create_task(self._say(job, FAILING.format(id=job.id, why=why)))
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)

    async def _review(self, fire: js.Fire) -> None:
        """Run the nightly review for its fire, unless a turn of the person's runs: then the
        fire is recorded skipped and the job tries again `IDLE_RETRY_S` later."""
        status, outcome, detail = "done", "reviewed", None
        # (A pass cut by a stop or a crash is recorded interrupted; the next start tries again.)
        if self.review is None:
            status, outcome, detail = "failed", "failed", "this scheduler cannot run the review"
        elif self.user_busy():
            status, outcome = "skipped", "skipped"
            detail = await self._busy(fire)
        else:
            try:
                detail = await self.review()
            except Exception as e:  # a failed pass is recorded; the next instant runs it again
                log.exception("the nightly review failed")
                status, outcome, detail = "failed", "failed", f"{type(e).__name__}: {e}"
        self._open.discard(fire.run_id)
        await self.store.call(
            js.finish_run, self.store, fire.run_id, status=status, outcome=outcome,
            now=self.clock.now(), detail=detail,
        )  # fmt: skip
        self.wake.set()

    async def _busy(self, fire: js.Fire) -> str:
        """Why the review's fire is skipped while a turn of the person's runs. A scheduled
        fire tries again `IDLE_RETRY_S` later; a run-now is only skipped: it promised to leave
        the schedule as it was, so the nightly instant stays (it used to move to 30 minutes
        after the skip)."""
        busy = "a turn you started was running"
        if fire.detail == js.RUN_NOW:
            return f"{busy}, so it did not run: ask again once that turn has ended"
        again = self.clock.now() + IDLE_RETRY_S
        await self.store.call(js.postpone, self.store, fire.job.id, again)
        return f"{busy}; it tries again at {when(again, self.zone, '%H:%M')}"

    async def release(self) -> None:
        """Give back the leases of runs still open (a scheduler that stops; `run` does it on
        its way out)."""
        await asyncio.shield(self._release())

    async def _tell(self, lost: list[js.Lost]) -> None:
        """Say in its conversation that a reminder will not come: shown to whoever has it
        open, and kept there as a Heron-authored row, as a monitor's message is (held on disk
        first, then moved in after any turn running there, without making the scheduler wait
        for that turn): the person looks there, not in `heron jobs runs`."""
        for item in lost:
            job = item.job
            due = when(item.due, self.zone)
            text = NOT_DELIVERED.format(id=job.id, due=due, why=item.why)
            await self._say(job, f"{text}\n{job.prompt}")

    async def _say(self, job: js.Job, text: str) -> None:
        """`text` in the reminder's conversation, as Heron's row: shown to whoever has it open,
        held on disk, then moved in after any turn running there."""
        who = f"scheduled job {job.id} (a reminder)"
        await self.store.call(
            waiting.hold, self.store, job.conversation, job.agent, text, who, CHANNEL
        )
        self.bus.emit(
            OutboundMessage(CHANNEL, job.conversation, job.conversation, text, "notice", by=who)
        )
        task = asyncio.create_task(self._move_in(job.conversation))
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)

    async def _move_in(self, key: str) -> None:
        try:
            await move_in(self.store, key)
        except Exception:  # it stays on disk: the next turn there, or a start, moves it in
            log.exception("could not move the scheduler's note into %s yet", key)

    async def _release(self) -> None:
        await self.store.call(js.release_all, self.store, self.owner, self.clock.now())
