"""The `work`, `cancel` and `job` messages of the serve protocol (docs/web.md): the proactive
work of the client's conversation (its goal, the jobs bound to it, the subagents that will
report back to it), the person ending one of them from the browser's work panel, and pausing,
resuming or running one of its jobs now.

Both answer the asking client alone with a `work` event, the state after the change, so the
panel redraws from what the store holds; a cancel that cannot be done is an `error`.
"""

from __future__ import annotations

import time
from typing import Any

from heron import timefmt
from heron.store import Store, goals, runs
from heron.store import jobs as js
from heron.store.schedule import ScheduleError
from heron.tools.schedule import NO_SERVE_NOW, asked, describe, next_words, resumed

Event = dict[str, Any]
TARGETS = ("goal", "job", "subagent")
LIVE = ("active", "paused")  # the jobs a person can still end


def _local(instant: float | None, zone: str) -> str | None:
    return None if instant is None else timefmt.when(instant, zone, named=True)


def _next_local(job: js.Job, zone: str, now: float) -> str | None:
    """The job's next time as the CLI says it (a due one whose run still goes waits for it)."""
    if job.status == "paused" or job.next_run is None:
        return None
    return next_words(job, zone, now)


def work_event(store: Store, key: str, zone: str, done: str | None = None) -> Event:
    """What works in conversation `key` without the person, as the panel shows it."""
    now = time.time()
    goal = goals.open_goal(store, key)
    event: Event = {
        "type": "work",
        "conversation": key,
        "goal": None
        if goal is None
        else {
            "objective": goal.objective,
            "status": goal.status,
            "turns_used": goal.turns_used,
            "max_turns": goal.max_turns,
            "tokens_used": goal.tokens_used,
            "max_tokens": goal.max_tokens,
        },
        "jobs": [
            {
                "id": job.id,
                "mode": job.mode,
                "status": job.status,  # active or paused: the panel offers pause or resume
                "schedule": job.schedule.describe(),
                "next_run": job.next_run,
                # As the CLI shows it: in the agent's zone, named (a browser elsewhere would
                # otherwise read its own zone's time for it).
                "next_local": _next_local(job, zone, now),
                "last_outcome": job.last_outcome,
                # Its run still going: the panel says so rather than the run before's outcome.
                "running": None
                if job.running_run is None
                else {"run": job.running_run, "since": _local(job.running_since, zone)},
                "prompt": job.prompt,
                "line": describe(job, zone),
            }
            for job in js.list_jobs(store, conversation=key)
        ],
        "subagents": [
            {
                "id": run.id,
                "task": run.task,
                "status": run.status,
                "started": run.created,
                "finished": run.finished,
                # Not started (at most 4 run at once): its place in line, and no clock.
                "waiting": (runs.waiting_for_slot(store, run) if run.status == "waiting" else None),
            }
            for run in runs.open_for(store, key)
            if run.kind == "subagent"
        ],
    }
    if done is not None:
        event["done"] = done
    return event


def cancel(store: Store, key: str, zone: str, message: dict[str, Any]) -> Event:
    """`{"type":"cancel","target":"goal"|"job"|"subagent","id":...}` for conversation `key`:
    the work event after it, or an error saying what to send instead. Only work of this
    conversation can be cancelled from it."""
    target, ident = message.get("target"), message.get("id")
    if target == "goal":
        ended = goals.end_goal(store, key, "stopped", "by the user")
        if ended is None:
            return _error("there is no open goal in this conversation", "Nothing to stop.")
        return work_event(store, key, zone, f"Goal stopped: {ended.objective}")
    if target == "job":
        job = js.get_job(store, ident) if isinstance(ident, int) else None
        if job is None or job.builtin or job.conversation != key or job.status not in LIVE:
            return _error(
                f"no active job {ident!r} in this conversation",
                'Send {"type":"work"} for its jobs and their ids.',
            )
        js.cancel_job(store, job.id)
        return work_event(store, key, zone, f"Cancelled job {job.id}.")
    if target == "subagent":
        run = runs.get(store, ident) if isinstance(ident, str) else None
        if run is None or run.kind != "subagent" or run.origin_key != key:
            return _error(
                f"no subagent {ident!r} reports to this conversation",
                'Send {"type":"work"} for its subagents and their ids.',
            )
        changed, said = runs.cancel_by_person(store, run)
        return work_event(store, key, zone, said) if changed else _error(said, "Nothing to cancel.")
    return _error(
        f"unknown cancel target {target!r}", f"target is one of {', '.join(TARGETS)}, with id."
    )


ACTIONS = ("pause", "resume", "run_now")


def control(
    store: Store, key: str, zone: str, message: dict[str, Any], now: float, can_run: bool
) -> Event:
    """`{"type":"job","action":"pause"|"resume"|"run_now","id":3}` for a job of conversation
    `key`, as `heron jobs pause/resume/run-now` do it: the work event after it (`done` says
    what was done: a resume when it fires next), or an error. `can_run`: a scheduler runs in
    this serve to take a run-now."""
    action, ident = message.get("action"), message.get("id")
    if action not in ACTIONS:
        return _error(f"unknown job action {action!r}", f"action is one of {', '.join(ACTIONS)}.")
    job = js.get_job(store, ident) if isinstance(ident, int) else None
    if job is None or job.builtin or job.conversation != key:
        return _error(
            f"no job {ident!r} in this conversation",
            'Send {"type":"work"} for its jobs and their ids.',
        )
    if action == "run_now" and not can_run:
        return _error(NO_SERVE_NOW.format(id=job.id), "This serve runs no scheduler.")
    try:
        if action == "pause":
            done = js.pause_job(store, job.id)
            said = f"Paused job {job.id}." if done.changed else f"Job {job.id} was paused."
        elif action == "resume":
            done = js.resume_job(store, job.id, now)
            said = resumed(done.job, zone) if done.changed else f"Job {job.id} is not paused."
        else:
            said = asked(js.request_run(store, job.id, now))
    except ScheduleError as e:
        return _error(e.summary, e.hint or "")
    return work_event(store, key, zone, said)


def _error(message: str, hint: str) -> Event:
    return {"type": "error", "message": message, "hint": hint}
