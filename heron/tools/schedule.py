"""The `schedule` tool: the agent creates, lists and cancels scheduled jobs.

A job is bound at creation to the conversation it was made in. A reminder later speaks there as
an ordinary, visible turn; a monitor runs silently in its own conversation `cron:<id>` and
reaches the user only through `message`. The scheduler of `heron serve` fires them
(heron/proactive/scheduler.py); this tool only writes rows (heron/store/jobs.py), and says
plainly when no `heron serve` runs to fire them. A background turn (a job's, the heartbeat's, a
subagent's) may list and cancel jobs but never create one, so a job cannot breed jobs; and the
agent keeps a bounded number of them (`create_within_caps`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

from heron import timefmt
from heron.errors import one_line
from heron.store import Store, jobs
from heron.store.engine_state import pid_alive
from heron.store.schedule import Schedule, ScheduleError, parse, user_timezone
from heron.tools.context import PERSONAL, ToolContext
from heron.tools.registry import ToolOutput, tool

Action = Literal["create", "list", "cancel", "pause", "resume", "run_now"]
# What the agent may keep: one turn made 40 per-minute monitors. The person's own
# `heron jobs add` is not bounded by these.
MAX_AGENT_JOBS_HERE = 10  # active or paused jobs of one conversation
MAX_AGENT_JOBS_HOME = 50  # active or paused jobs of the home
NOT_RUNNING = "saved; it fires while `heron serve` runs (none is running now)"


def serve_running(home: Path) -> bool:
    """Whether a `heron serve` holds this home: its serve.json names a live process."""
    try:
        info = json.loads((home / "serve.json").read_text(encoding="utf-8"))
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return pid_alive(pid)


def describe(job: jobs.Job, zone: str, now: float | None = None, *, serving: bool = True) -> str:
    """One line for a job; its next time in the agent's `zone`, named (as `heron jobs show`
    has it), whatever zone the job was made in. `serving=False` (`heron status` with no serve
    running): a job whose time has come says it runs once heron serve does."""
    now = time.time() if now is None else now
    when = "not scheduled"
    if job.status == "paused":
        when = "paused"
    elif not serving and job.next_run is not None and job.next_run <= now:
        when = "due; runs when heron serve runs"
    elif job.next_run is not None:
        when = f"next {next_words(job, zone, now)}"
    last = last_words(job, zone)
    last = f", {last}" if last else ""
    mode = "built-in review" if job.builtin else job.mode
    status = "disabled" if job.builtin and job.status == "cancelled" else job.status
    status = "damaged" if damaged(job) else status
    return (
        f"job {job.id} [{mode}, {status}] {job.schedule.describe()}, {when}{last}:"
        f" {_short(job.prompt)}"
    )


def next_words(job: jobs.Job, zone: str, now: float, *, named: bool = True) -> str:
    """An active job's next time in the agent's `zone`; one whose time has come while its own
    run still goes waits for that run (its next time in the past read as a time missed)."""
    assert job.next_run is not None
    if job.running_run is not None and job.next_run <= now:
        return f"due; waits for run {job.running_run} to finish"
    return timefmt.when(job.next_run, zone, named=named)


def last_words(job: jobs.Job, zone: str, *, named: bool = True) -> str:
    """What its last run did, "last delivered"; while a run goes, that it runs, since when
    (its outcome so far is the run before's, not this one's)."""
    if job.running_run is not None and job.running_since is not None:
        since = timefmt.when(job.running_since, zone, named=named)
        return f"running since {since} (run {job.running_run})"
    return f"last {job.last_outcome}" if job.last_outcome else ""


def damaged(job: jobs.Job) -> bool:
    """Whether the job's row cannot be read back: a schedule that does not parse, or a time
    no calendar shows (an older Heron saved `every 99999999d`, next in the year 275817). It is
    listed as damaged, with how to cancel it, rather than taking every listing down."""
    times = (job.next_run, job.last_run, job.created)
    in_range = all(t is None or timefmt.in_range(t) for t in times)
    return not (in_range and job.schedule.readable())


DAMAGED = (
    "Job {id} is damaged: its schedule or its next time cannot be read ({schedule}); it never "
    "fires as meant. To remove it: heron jobs cancel {id}"
)


def _at(instant: float, zone: str) -> str:
    """An instant in the agent's `zone`, with its weekday: `Mon 2026-12-07 09:00 CET`."""
    return timefmt.when(instant, zone, f"%a {timefmt.MINUTE}", named=True)


# `heron jobs cancel` of the nightly review is refused: its id sits among the person's jobs,
# and a cancel by mistake would turn a daily feature off where nothing lists it any more.
BUILTIN_CANCEL = (
    "job {id} is Heron's built-in nightly review of memory, not one of your jobs; it is not "
    "cancelled"
)
BUILTIN_HINT = (
    "To stop it for a while: heron jobs pause {id} (heron jobs resume {id} brings it back). To "
    "turn it off: [review] enabled = false in config.toml."
)
BUILTIN_REFUSED = (
    "Job {id} is Heron's built-in nightly review of memory; only the user pauses or turns it "
    "off (heron jobs pause {id}, or [review] enabled = false in config.toml)."
)
NO_SERVE_NOW = "no heron serve runs to run job {id} now (jobs fire only in heron serve)"


def resumed(job: jobs.Job, zone: str) -> str:
    """What a resume says: when it fires next, and that the paused-over times are not made up."""
    if job.status == "done":
        return (
            f"Job {job.id}'s one time ({job.schedule.describe()}) passed while it was paused, "
            f"so it has nothing left to run and is done. To have it once now: "
            f"heron jobs run-now {job.id}"
        )
    assert job.next_run is not None
    return (
        f"Resumed job {job.id}: next {_at(job.next_run, zone)}. The times it was paused over "
        "are not made up."
    )


def asked(done: jobs.Control) -> str:
    """What a run-now says: that it runs, where its answer goes, and that its schedule stays."""
    job = done.job
    if not done.changed:
        return f"Job {job.id} is already asked to run now; it starts at the scheduler's next look."
    where = (
        f"it answers in conversation {job.conversation!r}"
        if job.mode == "reminder"
        else "a monitor: silent unless it messages you"
        if job.mode == "monitor"
        else "the pass queues what it proposes for heron memory review"
    )
    keeps = "its schedule is unchanged" if job.status == "active" else f"it stays {job.status}"
    return f"Job {job.id} runs now ({where}); {keeps}. How it went: heron jobs runs {job.id}"


def _short(text: str, width: int = 80) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


@tool
async def schedule(
    ctx: ToolContext,
    action: Action,
    prompt: str | None = None,
    cron: str | None = None,
    every: str | None = None,
    at: str | None = None,
    mode: Literal["reminder", "monitor"] = "reminder",
    catch_up: Literal["once", "skip"] = "once",
    job: int | None = None,
) -> str | ToolOutput:
    """Create, list, pause, resume, run now or cancel scheduled jobs (recurring or one-off work
    of this conversation).

    reminder: at each time, `prompt` comes back to you in this conversation and your answer is
    shown to the user. monitor: each time, you check `prompt` silently in a conversation of its
    own; the user hears only what you send with the message tool. Times are the user's local
    time.

    Args:
        action: create, list (this conversation's jobs), pause (fires nothing until resumed),
            resume (from now; times passed meanwhile are not made up), run_now (once now,
            its schedule unchanged) or cancel.
        prompt: create: what to do or say when it fires, written so it makes sense on its own.
        cron: create: a cron expression, "minute hour day month weekday" ("0 9 * * 1-5").
        every: create: an interval such as "30m", "2h", "1d" (at least 1m).
        at: create: one local date and time, "2026-12-24 18:00".
        mode: create: reminder (speaks here) or monitor (silent unless it messages).
        catch_up: create: a time missed while Heron was not running runs once later (once) or
            is skipped (skip); either way it is recorded.
        job: pause, resume, run_now, cancel: the job's id.
    """
    store, key = ctx.services.store, ctx.services.conversation_key
    if store is None or key is None:
        return ToolOutput("Scheduling needs a stored conversation; this run has none.", True)
    zone = user_timezone(ctx.services.timezone)  # the one the runtime block tells the model
    if action == "list":
        found = await store.call(jobs.list_jobs, store, conversation=key)
        lines = [describe(j, zone) for j in found]
        return "\n".join(lines) or "No scheduled jobs in this conversation."
    if action == "cancel":
        return await _cancel(store, key, job, zone)
    turn = ctx.services.turn
    background = turn is not None and turn.provenance not in PERSONAL
    if action != "create":
        return await _control(ctx, store, action, job, background)
    if background:
        # Not even a one-off: a one-off's own turn could make the next, a chain with no end.
        return ToolOutput(
            "Background work (a scheduled job, the heartbeat, a subagent) cannot create jobs. "
            "If the user should set one up, tell them so.",
            True,
        )
    return await _create(ctx, store, key, prompt, cron, every, at, mode, catch_up)


async def _cancel(store: Store, key: str, job: int | None, zone: str) -> str | ToolOutput:
    if job is None:
        return ToolOutput("cancel needs job: the id shown by action=list.", True)
    known = await store.call(jobs.get_job, store, job)
    if known is not None and known.builtin:  # memory is the person's: the agent keeps off it
        return ToolOutput(BUILTIN_REFUSED.format(id=job), True)
    if known is None or not _here(known, key):
        return ToolOutput(NOT_HERE.format(id=job), True)
    found = await store.call(jobs.cancel_job, store, job)
    if found is None:
        return ToolOutput(NOT_HERE.format(id=job), True)
    return f"Cancelled: {describe(found, zone)}"


# A job of another conversation is out of this one's reach, and said as no job at all: a model
# reading a hostile document cancelled the person's reminders everywhere by guessing small ids.
NOT_HERE = (
    "There is no job {id} in this conversation; action=list shows its jobs (the person manages "
    "every job with `heron jobs`)."
)


def _here(job: jobs.Job, key: str) -> bool:
    """Whether the tool may act on `job` from conversation `key`: a job made there, or the
    monitor whose own silent conversation this is (it may pause itself)."""
    return job.conversation == key or key == f"cron:{job.id}"


async def _control(
    ctx: ToolContext, store: Store, action: str, job: int | None, background: bool
) -> str | ToolOutput:
    """pause, resume, run_now: as `heron jobs` does them. A background run may pause but not
    resume or run a job, so jobs cannot wake each other in a loop."""
    if job is None:
        return ToolOutput(f"{action} needs job: the id shown by action=list.", True)
    if background and action != "pause":
        return ToolOutput(f"Background work cannot {action} jobs; tell the user instead.", True)
    known = await store.call(jobs.get_job, store, job)
    if known is not None and known.builtin:
        return ToolOutput(BUILTIN_REFUSED.format(id=job), True)
    key = ctx.services.conversation_key
    if known is None or key is None or not _here(known, key):
        return ToolOutput(NOT_HERE.format(id=job), True)
    poke = ctx.services.jobs_changed
    if action == "run_now" and poke is None and not _serve_at(ctx):
        return ToolOutput(NO_SERVE_NOW.format(id=job), True)
    zone = user_timezone(ctx.services.timezone)
    try:
        if action == "pause":
            done = await store.call(jobs.pause_job, store, job)
            paused = f"Paused: {describe(done.job, zone)}"
            said = paused if done.changed else "It was already paused."
        elif action == "resume":
            done = await store.call(jobs.resume_job, store, job, time.time())
            not_paused = f"Not paused: {describe(done.job, zone)}"
            said = resumed(done.job, zone) if done.changed else not_paused
        else:
            done = await store.call(jobs.request_run, store, job, time.time())
            said = asked(done)
    except ScheduleError as e:
        return ToolOutput(str(e), True)
    if poke is not None and done.changed:
        poke()
    return said


def _serve_at(ctx: ToolContext) -> bool:
    home = ctx.services.home
    return home is not None and serve_running(home)


async def _create(
    ctx: ToolContext,
    store: Store,
    key: str,
    prompt: str | None,
    cron: str | None,
    every: str | None,
    at: str | None,
    mode: str,
    catch_up: str,
) -> str | ToolOutput:
    if not prompt or not prompt.strip():
        return ToolOutput("create needs prompt: what to do or say when the job fires.", True)
    try:
        zone = user_timezone(ctx.services.timezone)
        when = parse(cron=cron, every=every, at=at, timezone=zone)
        made = await store.call(
            create_within_caps,
            store,
            when,
            conversation=key,
            prompt=prompt.strip(),
            now=time.time(),
            mode=mode,
            catch_up=catch_up,
            created_by="tool",
            agent=ctx.services.agent,
        )
    except ScheduleError as e:
        return ToolOutput(str(e), True)
    poke = ctx.services.jobs_changed
    if poke is not None:
        poke()
    home = ctx.services.home
    running = home is None or serve_running(home) or poke is not None
    return f"Created {describe(made, zone)}" + ("" if running else f"\n{NOT_RUNNING}")


def create_within_caps(store: Store, schedule: Schedule, **job: Any) -> jobs.Job:
    """`jobs.create_job` unless the agent already keeps its share of jobs here or in the home;
    counted and created in one synchronous call, so the calls of one reply cannot all pass the
    count before any has created."""
    key = job["conversation"]
    here = len(jobs.list_jobs(store, conversation=key))
    home = sum(1 for j in jobs.list_jobs(store) if not j.builtin)
    if here >= MAX_AGENT_JOBS_HERE or home >= MAX_AGENT_JOBS_HOME:
        where = (
            f"this conversation already has {here} active or paused jobs"
            if here >= MAX_AGENT_JOBS_HERE
            else f"the user already has {home} active or paused jobs"
        )
        raise ScheduleError(
            f"not created: {where}, the most the agent may make "
            f"({MAX_AGENT_JOBS_HERE} in a conversation, {MAX_AGENT_JOBS_HOME} in all)",
            hint="Cancel one that is no longer needed (action=list, then cancel), or ask the "
            "user to add it themselves with heron jobs add.",
        )
    return jobs.create_job(store, schedule, **job)


def status_lines(store: Store, key: str, zone: str, limit: int = 3) -> list[str]:
    """/status: the jobs bound to this conversation (soonest first), how many others there are,
    and the heartbeat's last tick, in the agent's `zone`; nothing when none of it exists."""
    mine = jobs.list_jobs(store, conversation=key)
    active = jobs.list_jobs(store)
    others = sum(1 for j in active if not j.builtin) - len(mine)
    lines = []
    if mine or others:
        lines.append(f"jobs: {len(mine)} here, {others} in other conversations")
        lines += [f"  {describe(job, zone)}" for job in mine[:limit]]
        if len(mine) > limit:
            lines.append(f"  … and {len(mine) - limit} more (heron jobs list)")
    review = next((j for j in active if j.builtin and j.next_run is not None), None)
    if review is not None:
        assert review.next_run is not None
        last = last_words(review, zone, named=False)
        last = f", {last}" if last else ""
        when = f"next {next_words(review, zone, time.time(), named=False)}"
        if review.status == "paused":  # its kept instant is only where a resume starts from
            when = f"paused (heron jobs resume {review.id})"
        lines.append(f"nightly review: job {review.id}, {when}{last}")
    beat = jobs.tick(store, "heartbeat")
    if beat is not None and beat.outcome not in (None, "started"):
        # In the agent's zone, as the review's and the jobs' times above: one /status, one clock.
        why = f" ({one_line(beat.detail)})" if beat.detail else ""  # a failure's hint too
        lines.append(f"heartbeat: last {timefmt.when(beat.last, zone)} {beat.outcome}{why}")
    return lines
