"""Store functions of scheduled jobs: create, list, cancel, claim what is due, record each run.

Every function takes a `Store` and the time `now` (epoch seconds) from its caller, so the
scheduler's clock, fake in tests, is the only clock. `claim_due` is the one place a job is
decided: inside `BEGIN IMMEDIATE` (serialized across processes) it takes the due jobs whose
lease is free, writes a `job_runs` row for each fire or skip, advances `next_run` and leases the
fired ones to their owner until their turn ends, so two schedulers on one home never fire a job
twice and a missed instant is never dropped without a row saying so.

`recover`, at a scheduler's start, closes the runs a scheduler that is gone left `running`
(kill -9, a crash) and runs once more, late and saying so, a job whose run was cut off before
its turn finished (a one-shot reminder is otherwise never due again); a reminder that will not
come is said in its conversation (`Lost`).
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from dataclasses import dataclass
from typing import Literal

from heron.store.db import Store
from heron.store.engine_state import HOST, pid_alive
from heron.store.pg import row_lock
from heron.store.schedule import Schedule, ScheduleError, zone_of
from heron.timefmt import when

Mode = Literal["reminder", "monitor"]
CatchUp = Literal["once", "skip"]
MODES: tuple[str, ...] = ("reminder", "monitor")  # what a person or the agent can create
REVIEW = "review"  # the built-in job of the nightly review of memory (migration m010)
CATCH_UPS: tuple[str, ...] = ("once", "skip")
LATE_S = 60.0  # fired this long after its instant, a run counts as missed (no scheduler ran)
LEASE_TTL = 15 * 60.0  # a fired job's lease without renewal; renewed while its turn runs
CLAIM_BATCH = 500  # due jobs decided per transaction (a short write lock however many are due)
# A cron job's missed instants counted one by one (inside the claim's write lock, ~0.2 ms
# each); beyond, "over". An interval's are counted exactly, without walking.
_MAX_COUNTED = 100
WHY_MISSED = " (no scheduler ran then, or its previous run was still going)"
STOPPED = "the scheduler stopped before its turn ended"  # a SIGTERM'd serve's open runs
CRASHED = "the process running it ended (killed or crashed) before its turn ended"
# A first time further off than this is a slip, and far enough off no calendar shows it.
MAX_AHEAD_S = 10 * 366 * 86400.0
RUN_META = "job_run"  # meta of a fired turn's message: the run it stands for (`recover`)


@dataclass(frozen=True)
class Job:
    id: int
    schedule: Schedule
    conversation: str  # the conversation it was made in (a reminder speaks there)
    agent: str
    mode: str
    prompt: str
    catch_up: str
    status: str  # active | paused | done | cancelled
    created: float
    created_by: str
    next_run: float | None
    last_run: float | None
    last_outcome: str | None
    lease_owner: str | None
    run_now: float | None = None  # someone asked it to run once now (`request_run`)
    # Its run still going, and since when (`get_job`, `list_jobs`, `review_job` read them):
    # while it runs, `last_run` is its start and `last_outcome` the run before's.
    running_run: int | None = None
    running_since: float | None = None

    @property
    def key(self) -> str:
        """The conversation its turns run in: its own for a monitor, else the bound one."""
        return f"cron:{self.id}" if self.mode == "monitor" else self.conversation

    @property
    def builtin(self) -> bool:
        """Heron's own job (the nightly review): bound to no conversation, made by no one."""
        return self.mode == REVIEW


@dataclass(frozen=True)
class JobRun:
    id: int
    job_id: int
    due: float
    started: float
    ended: float | None
    status: str  # running | done | failed | skipped | interrupted
    outcome: str | None
    detail: str | None


@dataclass(frozen=True)
class Fire:
    """A job claimed to fire now: its run row, the instant it stands for, and why if late."""

    job: Job
    run_id: int
    due: float
    detail: str | None = None


@dataclass(frozen=True)
class Lost:
    """A reminder that will not arrive (skipped, or cut off and not run again): its
    conversation is told, where the person would look for it."""

    job: Job
    due: float
    why: str


@dataclass(frozen=True)
class Recovered:
    """What a scheduler's start found: runs to fire again now, and reminders to say are lost."""

    fires: list[Fire]
    lost: list[Lost]


def _job(r: sqlite3.Row) -> Job:
    columns = r.keys()  # (a row's `in` looks at its values)
    return Job(
        r["id"],
        Schedule(r["kind"], r["spec"], r["timezone"]),
        r["conversation"],
        r["agent"],
        r["mode"],
        r["prompt"],
        r["catch_up"],
        r["status"],
        r["created"],
        r["created_by"],
        r["next_run"],
        r["last_run"],
        r["last_outcome"],
        r["lease_owner"],
        r["run_now"],
        *((r["running_run"], r["running_since"]) if "running_run" in columns else ()),
    )


def _run(r: sqlite3.Row) -> JobRun:
    return JobRun(
        r["id"], r["job_id"], r["due"], r["started"], r["ended"], r["status"], r["outcome"],
        r["detail"],
    )  # fmt: skip


def create_job(
    store: Store,
    schedule: Schedule,
    *,
    conversation: str,
    prompt: str,
    now: float,
    mode: str = "reminder",
    catch_up: str = "once",
    created_by: str = "tool",
    agent: str = "default",
) -> Job:
    """A new active job; its first instant is the first one after `now`. The caller has
    checked the schedule (`heron.store.schedule.parse`); an instant already past is refused,
    and so is a blank prompt (each firing would send the model an empty message)."""
    if not prompt.strip():
        raise ScheduleError(
            "the job's prompt is empty",
            hint="Say what the job should do or check when it fires, e.g. "
            '"remind me to water the plants".',
        )
    base = now + int(schedule.spec) if schedule.kind == "every" else None
    first = schedule.next_after(now, base=base)
    if first is None:
        raise ScheduleError(
            f"{schedule.describe()} is already past", hint="Give a time in the future."
        )
    if first - now > MAX_AHEAD_S:
        raise ScheduleError(
            f"{schedule.describe()} is more than 10 years away",
            hint="Give a time within the next 10 years.",
        )
    with store.transaction() as c:
        cur = c.execute(
            "INSERT INTO jobs (kind, spec, timezone, conversation, agent, mode, prompt, catch_up,"
            " created, created_by, next_run) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                schedule.kind, schedule.spec, schedule.timezone, conversation, agent, mode,
                prompt, catch_up, now, created_by, first,
            ),
        )  # fmt: skip
    assert cur.lastrowid is not None
    found = get_job(store, cur.lastrowid)
    assert found is not None
    return found


# A job with the run of it still going, if any (read through the partial index of runs
# without an outcome, m027): what `heron jobs show`, the list and the work panel say of it.
_WITH_RUNNING = (
    "SELECT jobs.*, r.id AS running_run, r.started AS running_since FROM jobs"
    " LEFT JOIN job_runs r ON r.id = (SELECT MAX(o.id) FROM job_runs o WHERE"
    " o.job_id = jobs.id AND o.outcome IS NULL AND o.status = 'running')"
)


def get_job(store: Store, job_id: int) -> Job | None:
    rows = store.query(_WITH_RUNNING + " WHERE jobs.id = ?", (job_id,))
    return _job(rows[0]) if rows else None


def list_jobs(
    store: Store, *, everything: bool = False, conversation: str | None = None
) -> list[Job]:
    """Active and paused jobs (all of them with `everything`), soonest first; of one
    conversation if given."""
    where, params = [], []
    if not everything:
        where.append("jobs.status IN ('active', 'paused')")
    if conversation is not None:
        where.append("jobs.conversation = ?")
        params.append(conversation)
    sql = _WITH_RUNNING + (f" WHERE {' AND '.join(where)}" if where else "")
    sql += " ORDER BY jobs.next_run IS NULL, jobs.next_run, jobs.id"
    return [_job(r) for r in store.query(sql, params)]


def cancel_job(store: Store, job_id: int) -> Job | None:
    """Cancel an active or paused job (a turn it already started runs to its end; a run asked
    for and not yet started does not start); None if unknown."""
    with store.transaction() as c:
        c.execute(
            "UPDATE jobs SET status = 'cancelled', next_run = NULL, run_now = NULL WHERE id = ?"
            " AND status IN ('active', 'paused')",
            (job_id,),
        )
    return get_job(store, job_id)


# ---- a person's control of a job: pause, resume, run once now ------------------------------

RUN_NOW = "run now, as asked, outside its schedule (which it keeps)"  # such a run's detail


@dataclass(frozen=True)
class Control:
    """What `pause_job`, `resume_job` or `request_run` did: the job after it, and whether it
    changed (False: it already was so, e.g. paused twice)."""

    job: Job
    changed: bool


def _known(c: sqlite3.Connection, job_id: int, action: str) -> sqlite3.Row:
    """Job `job_id`'s row, locked; a clear refusal when there is none or it is cancelled."""
    row: sqlite3.Row | None = c.execute(
        "SELECT * FROM jobs WHERE id = ?" + row_lock(c), (job_id,)
    ).fetchone()
    if row is None:
        raise ScheduleError(f"there is no job {job_id}", hint="heron jobs list shows them.")
    if row["status"] == "cancelled":
        raise ScheduleError(
            f"job {job_id} is cancelled, so it cannot {action}",
            hint="A cancelled job stays so: add it again (heron jobs add, or ask the agent).",
        )
    return row


def _control(store: Store, job_id: int, changed: bool) -> Control:
    found = get_job(store, job_id)
    assert found is not None
    return Control(found, changed)


def pause_job(store: Store, job_id: int) -> Control:
    """Pause an active job: its schedule fires nothing until `resume_job`, across restarts (a
    run asked for and not yet started is dropped; `request_run` still runs it once). Its next
    instant is kept for `resume_job` to start from. A run already started finishes."""
    with store.transaction() as c:
        row = _known(c, job_id, "be paused")
        if row["status"] == "done":
            raise ScheduleError(
                f"job {job_id} is done: its one time has passed, so there is nothing to pause",
                hint=f"heron jobs run-now {job_id} runs it once more.",
            )
        if row["status"] == "paused":
            return _control(store, job_id, False)
        c.execute("UPDATE jobs SET status = 'paused', run_now = NULL WHERE id = ?", (job_id,))
    return _control(store, job_id, True)


def resume_job(store: Store, job_id: int, now: float) -> Control:
    """Resume a paused job from `now`: the instants that passed while it was paused are not
    caught up (its next instant is the first after `now`, an interval keeping its phase); a
    one-shot job whose time passed meanwhile is done, with nothing left to run."""
    with store.transaction() as c:
        row = _known(c, job_id, "be resumed")
        if row["status"] != "paused":
            return _control(store, job_id, False)
        job = _job(row)
        after = job.schedule.next_after(now, base=job.next_run)
        c.execute(
            "UPDATE jobs SET status = ?, next_run = ? WHERE id = ?",
            ("active" if after is not None else "done", after, job_id),
        )
    return _control(store, job_id, True)


def move_zone(store: Store, job_id: int, zone: str, now: float) -> Control:
    """Read a cron job's times in `zone` from now on (the person moved, and "every day at 9"
    should be 9 where they are now): its next instant is the first after `now` by that zone's
    clock; a paused one keeps waiting for `resume_job`, which starts from the new zone's. An
    interval or a one-off time is an instant, the same in every zone: refused, as is the
    nightly review, which follows `[agent] timezone` by itself (heron/proactive/review.py)."""
    zone_of(zone)  # an unknown name is refused before anything is read
    with store.transaction() as c:
        job = _job(_known(c, job_id, "move"))
        if job.builtin:
            raise ScheduleError(
                "the nightly review follows [agent] timezone by itself",
                hint="Set [agent] timezone in config.toml; the next serve start moves it.",
            )
        if job.schedule.kind != "cron":
            raise ScheduleError(
                f"job {job_id} runs {job.schedule.describe()}: an instant, the same in every "
                "zone, so there is nothing to move",
                hint="Only a cron job reads its times by a zone's clock.",
            )
        if job.schedule.timezone == zone:
            return _control(store, job_id, False)
        moved = Schedule(job.schedule.kind, job.schedule.spec, zone)
        upcoming = moved.next_after(now) if job.next_run is not None else None
        c.execute(
            "UPDATE jobs SET timezone = ?, next_run = ? WHERE id = ?", (zone, upcoming, job_id)
        )
    return _control(store, job_id, True)


def request_run(store: Store, job_id: int, now: float) -> Control:
    """Ask that job `job_id` run once now, as an ordinary fire recorded in its runs, without
    moving its schedule: a scheduler fires it at its next look (`claim_due`). A done one-shot
    job may run again this way; a paused one runs once and stays paused. Refused for a
    cancelled job and while a run of the job is running."""
    with store.transaction() as c:
        row = _known(c, job_id, "run")
        if row["lease_owner"] is not None and not _lease_free(row, now):
            raise ScheduleError(
                f"job {job_id} is running now",
                hint=f"Wait for its run to end (heron jobs runs {job_id}), then ask again.",
            )
        if row["run_now"] is not None:
            return _control(store, job_id, False)
        c.execute("UPDATE jobs SET run_now = ? WHERE id = ?", (now, job_id))
    return _control(store, job_id, True)


def _claim_asked(
    c: sqlite3.Connection,
    owner: str,
    pid: int,
    now: float,
    grace_s: float,
    modes: tuple[str, ...] | None,
    only: int | None = None,
    zone: str | None = None,
) -> list[Fire]:
    """Fire the jobs someone asked to run now (`request_run`) whose lease is free (job `only`
    alone, when given); their schedule and status stay as they are. One asked while its run
    ran waits for it to end; one no scheduler took within the grace period (none ran) is
    recorded skipped. Any asked is taken, whatever its instant: another host's clock may run
    ahead."""
    one = " AND id = ?" if only is not None else ""
    rows = c.execute(
        "SELECT * FROM jobs WHERE run_now IS NOT NULL AND status <> 'cancelled'"
        + _of_modes(modes)
        + one
        + " ORDER BY run_now"
        + row_lock(c),
        (*(modes or ()), *(() if only is None else (only,))),
    ).fetchall()
    fires = []
    for row in rows:
        if not _lease_free(row, now):
            continue
        if row["lease_owner"] is not None:
            _interrupted(c, row["id"], row["lease_owner"], now)
        job, asked = _job(row), row["run_now"]
        if now - asked > grace_s:
            why = f"asked to run now at {_when(asked, job, zone)}; no scheduler ran"
            why += " until past the grace"
            c.execute(
                "INSERT INTO job_runs (job_id, due, started, ended, status, outcome, detail,"
                " owner) VALUES (?, ?, ?, ?, 'skipped', 'skipped', ?, ?)",
                (job.id, asked, now, now, why, owner),
            )
            c.execute("UPDATE jobs SET run_now = NULL WHERE id = ?", (job.id,))
            continue
        fires.append(_fire(c, job, owner, pid, now, asked, RUN_NOW))
    return fires


def claim_asked(
    store: Store,
    job_id: int,
    owner: str,
    pid: int,
    now: float,
    grace_s: float,
    zone: str | None = None,
) -> Fire | None:
    """Fire job `job_id`'s asked run if its lease is free: `heron jobs run-now` with no serve
    running runs it in its own process. None when another scheduler took it first. `zone`:
    the agent's, the times a run's note gives are in (`_when`)."""
    with store.transaction() as c:
        fires = _claim_asked(c, owner, pid, now, grace_s, None, only=job_id, zone=zone)
    return fires[0] if fires else None


def review_job(store: Store) -> Job | None:
    rows = store.query(_WITH_RUNNING + " WHERE jobs.mode = ?", (REVIEW,))
    return _job(rows[0]) if rows else None


def sync_review(
    store: Store, schedule: Schedule, enabled: bool | None, now: float, prompt: str
) -> Job:
    """Bring the built-in review job in line with config.toml: its schedule, and with
    `enabled` given, whether it runs (None leaves the job as it is, e.g. disabled by an older
    `heron jobs cancel`; a pause by `heron jobs pause` stays either way). Its next instant is
    kept unless the schedule changed or it had none, so an instant missed while nothing ran
    still counts for catch-up; a new time is never a second pass the day one ran."""
    with store.transaction() as c:
        row = c.execute("SELECT * FROM jobs WHERE mode = ?", (REVIEW,)).fetchone()
        if row is None:  # the migration's row is gone: made again
            c.execute(
                "INSERT INTO jobs (kind, spec, timezone, conversation, mode, prompt, created,"
                " created_by) VALUES (?, ?, ?, '', ?, ?, ?, 'heron')",
                (schedule.kind, schedule.spec, schedule.timezone, REVIEW, prompt, now),
            )
            row = c.execute("SELECT * FROM jobs WHERE mode = ?", (REVIEW,)).fetchone()
        job = _job(row)
        status = job.status
        if enabled is not None:  # config turns it on or off; a pause (`heron jobs`) stays
            status = "cancelled" if not enabled else "paused" if status == "paused" else "active"
        moved = job.schedule != schedule
        if status not in ("active", "paused"):
            next_run = None
        elif moved or job.next_run is None:
            next_run = schedule.next_after(_reviewed_today(c, job.id, schedule, now))
        else:
            next_run = job.next_run
        c.execute(
            "UPDATE jobs SET kind = ?, spec = ?, timezone = ?, status = ?, next_run = ?,"
            " prompt = ? WHERE id = ?",
            (schedule.kind, schedule.spec, schedule.timezone, status, next_run, prompt, job.id),
        )
    found = get_job(store, job.id)
    assert found is not None
    return found


def _reviewed_today(c: sqlite3.Connection, job_id: int, schedule: Schedule, now: float) -> float:
    """Where the review's next instant is looked for after its time changed: `now`, or the
    end of today (in the schedule's zone) when a pass ran or runs today already, so a new
    time later today is not a second pass the same day."""
    zone = schedule.zone()
    today = dt.datetime.fromtimestamp(now, zone).replace(hour=0, minute=0, second=0, microsecond=0)
    passed = c.execute(
        "SELECT 1 FROM job_runs WHERE job_id = ? AND status IN ('done', 'running') AND"
        " started >= ? LIMIT 1",
        (job_id, today.timestamp()),
    ).fetchone()
    if passed is None:
        return now
    tomorrow = today + dt.timedelta(days=1)  # wall-clock arithmetic: midnight in that zone
    return max(now, tomorrow.timestamp() - 1.0)


def postpone(store: Store, job_id: int, until: float) -> None:
    """An active job's next instant brought to `until` if that is sooner (a built-in job that
    could not run now tries again then; its own schedule resumes after)."""
    with store.transaction() as c:
        c.execute(
            "UPDATE jobs SET next_run = ? WHERE id = ? AND status = 'active' AND"
            " (next_run IS NULL OR next_run > ?)",
            (until, job_id, until),
        )


def runs(store: Store, job_id: int | None = None, limit: int = 50) -> list[JobRun]:
    """The latest runs, newest first (of one job if given)."""
    if job_id is None:
        rows = store.query("SELECT * FROM job_runs ORDER BY id DESC LIMIT ?", (limit,))
    else:
        rows = store.query(
            "SELECT * FROM job_runs WHERE job_id = ? ORDER BY id DESC LIMIT ?", (job_id, limit)
        )
    return [_run(r) for r in rows]


def starts_failing(store: Store, job_id: int, run_id: int) -> bool:
    """Whether the failed run `run_id` of job `job_id` begins a run of failures: the run of
    that job before it that ran (a skip did not run) did not fail, or there is none."""
    rows = store.query(
        "SELECT status FROM job_runs WHERE job_id = ? AND id < ? AND status != 'skipped'"
        " ORDER BY id DESC LIMIT 1",
        (job_id, run_id),
    )
    return not rows or rows[0][0] != "failed"


def next_due(
    store: Store, *, unleased: bool = False, modes: tuple[str, ...] | None = None
) -> float | None:
    """The soonest instant of an active job, or run asked for now (of those `modes` if
    given); with `unleased`, of one whose lease is free (a leased job waits for its turn to
    end, which wakes the scheduler)."""
    free = " AND lease_owner IS NULL" if unleased else ""
    found = []
    for sql in (  # its schedule's instants, and a run asked for now (`request_run`)
        "SELECT MIN(next_run) FROM jobs WHERE status = 'active'",
        "SELECT MIN(run_now) FROM jobs WHERE status <> 'cancelled'",
    ):
        soonest = store.query(sql + free + _of_modes(modes), modes or ())[0][0]
        if soonest is not None:
            found.append(float(soonest))
    return min(found, default=None)


# ---- the scheduler's side -------------------------------------------------------------------


def _of_modes(modes: tuple[str, ...] | None) -> str:
    return f" AND mode IN ({', '.join('?' for _ in modes)})" if modes else ""


def claim_due(
    store: Store,
    owner: str,
    pid: int,
    now: float,
    grace_s: float,
    limit: int = CLAIM_BATCH,
    modes: tuple[str, ...] | None = None,
    lost: list[Lost] | None = None,
    zone: str | None = None,
) -> list[Fire]:
    """Decide every due job (of those `modes` if given) whose lease is free, in one
    transaction: fire it (a `running` run row, the lease to `owner`) or skip it (a `skipped`
    row), and advance `next_run`. A one-shot reminder skipped is added to `lost`. `zone`: the
    agent's, the missed times a run's note gives are in (`_when`)."""
    fires: list[Fire] = []
    with store.transaction() as c:
        # Locked on PostgreSQL: a second scheduler's claim waits, then reads the advanced
        # next_run and passes the job by (on SQLite BEGIN IMMEDIATE already serializes them).
        rows = c.execute(
            "SELECT * FROM jobs WHERE status = 'active' AND next_run <= ?"
            + _of_modes(modes)
            + " ORDER BY next_run LIMIT ?"
            + row_lock(c),
            (now, *(modes or ()), limit),
        ).fetchall()
        for row in rows:
            if not _lease_free(row, now):
                continue
            if row["lease_owner"] is not None:
                _interrupted(c, row["id"], row["lease_owner"], now)
            decided = _decide(c, _job(row), owner, pid, now, grace_s, zone)
            if isinstance(decided, Fire):
                fires.append(decided)
            elif decided is not None and lost is not None:
                lost.append(decided)
        fires += _claim_asked(c, owner, pid, now, grace_s, modes, zone=zone)
    return fires


def _lease_free(row: sqlite3.Row, now: float) -> bool:
    if row["lease_owner"] is None:
        return True
    if row["lease_until"] < now:
        return True
    return row["lease_host"] == HOST and not pid_alive(row["lease_pid"])


def _interrupted(c: sqlite3.Connection, job_id: int, owner: str, now: float) -> None:
    """The lease's holder died with a run open: that run ended with it."""
    c.execute(
        "UPDATE job_runs SET status = 'interrupted', ended = ?, detail = ? WHERE job_id = ? AND"
        " owner = ? AND status = 'running'",
        (now, CRASHED, job_id, owner),
    )


def _decide(
    c: sqlite3.Connection,
    job: Job,
    owner: str,
    pid: int,
    now: float,
    grace_s: float,
    zone: str | None,
) -> Fire | Lost | None:
    """Fire or skip one due job; a skipped one-shot reminder comes back as `Lost`."""
    assert job.next_run is not None
    due = job.next_run
    after = job.schedule.next_after(now, base=due)
    done = after is None
    fire_at: float | None = due
    detail: str | None = None
    if now - due > LATE_S:  # no scheduler ran at its instant
        missed, last = _missed(job, due, now)
        over = job.schedule.kind == "cron" and missed > _MAX_COUNTED
        count = f"over {_MAX_COUNTED:,}" if over else f"{missed:,}"
        span = f"{count} instant{'s' if missed != 1 else ''} ({_when(due, job, zone)}"
        span += f" to {_when(last, job, zone)})" if missed > 1 else ")"
        if job.catch_up == "once" and now - last <= grace_s:
            fire_at, detail = last, f"caught up once for {span} missed{WHY_MISSED}"
        else:
            why = "catch_up = skip" if job.catch_up == "skip" else "past the grace period"
            fire_at, detail = None, f"skipped {span} missed{WHY_MISSED}; {why}"
    c.execute(
        "UPDATE jobs SET next_run = ?, status = ? WHERE id = ?",
        (after, "done" if done else "active", job.id),
    )
    if fire_at is None:
        c.execute(
            "INSERT INTO job_runs (job_id, due, started, ended, status, outcome, detail, owner)"
            " VALUES (?, ?, ?, ?, 'skipped', 'skipped', ?, ?)",
            (job.id, due, now, now, detail, owner),
        )
        c.execute(
            "UPDATE jobs SET last_outcome = 'skipped', lease_owner = NULL WHERE id = ?", (job.id,)
        )
        told = job.mode == "reminder" and job.schedule.kind == "at"
        return Lost(job, due, detail or "skipped") if told else None
    return _fire(c, job, owner, pid, now, fire_at, detail)


def _fire(
    c: sqlite3.Connection,
    job: Job,
    owner: str,
    pid: int,
    now: float,
    due: float,
    detail: str | None,
) -> Fire:
    """A `running` run row for `job` and its lease to `owner` until its turn ends."""
    cur = c.execute(
        "INSERT INTO job_runs (job_id, due, started, status, detail, owner)"
        " VALUES (?, ?, ?, 'running', ?, ?)",
        (job.id, due, now, detail, owner),
    )
    c.execute(
        "UPDATE jobs SET last_run = ?, lease_owner = ?, lease_host = ?, lease_pid = ?,"
        " lease_until = ?, run_now = NULL WHERE id = ?",
        (now, owner, HOST, pid, now + LEASE_TTL, job.id),
    )
    assert cur.lastrowid is not None
    return Fire(job, cur.lastrowid, due, detail)


def _missed(job: Job, due: float, now: float) -> tuple[int, float]:
    """How many instants from `due` to `now` (a cron job's counted up to a bound: beyond it,
    the bound plus one), and the latest, found directly (not by walking to it)."""
    if job.schedule.kind == "every":
        step = int(job.schedule.spec)
        behind = int((now - due) // step)
        return behind + 1, due + behind * step
    last = job.schedule.last_at_or_before(now)
    if last is None or last < due:
        return 1, due
    count, at = 1, due
    while count <= _MAX_COUNTED:
        nxt = job.schedule.next_after(at, base=at)
        if nxt is None or nxt > last:
            break
        count, at = count + 1, nxt
    return count, last


def _when(instant: float, job: Job, zone: str | None) -> str:
    """`instant` as a run's note gives it: in the agent's `zone`, as every time Heron shows
    (docs/proactive.md, "Every time Heron shows"), not in the job's own, which a cron job made
    in another zone keeps and which the person and the model would read as theirs (qa24e M1).
    None (a caller that does not know the agent's zone: some tests) is the job's."""
    return when(instant, zone or job.schedule.timezone)


def renew_leases(store: Store, owner: str, now: float) -> None:
    """Keep the leases of fired jobs whose turns still run."""
    with store.transaction() as c:
        c.execute("UPDATE jobs SET lease_until = ? WHERE lease_owner = ?", (now + LEASE_TTL, owner))


def finish_run(
    store: Store, run_id: int, *, status: str, outcome: str, now: float, detail: str | None = None
) -> None:
    """A fired run's turn ended: its row, the job's last outcome, and the lease given back."""
    with store.transaction() as c:
        row = c.execute("SELECT job_id, owner, detail FROM job_runs WHERE id = ?", (run_id,))
        found = row.fetchone()
        if found is None:
            return
        joined = "; ".join(d for d in (found["detail"], detail) if d) or None
        c.execute(
            "UPDATE job_runs SET status = ?, outcome = ?, ended = ?, detail = ? WHERE id = ?",
            (status, outcome, now, joined, run_id),
        )
        c.execute(
            "UPDATE jobs SET last_outcome = ?, lease_owner = NULL, lease_host = NULL,"
            " lease_pid = NULL, lease_until = NULL WHERE id = ? AND lease_owner = ?",
            (outcome, found["job_id"], found["owner"]),
        )


def release_all(store: Store, owner: str, now: float) -> None:
    """A scheduler stopping: its open runs are interrupted and its leases given back."""
    with store.transaction() as c:
        c.execute(
            "UPDATE job_runs SET status = 'interrupted', ended = ?, detail = ? WHERE owner = ?"
            " AND status = 'running'",
            (now, STOPPED, owner),
        )
        c.execute(
            "UPDATE jobs SET lease_owner = NULL, lease_host = NULL, lease_pid = NULL,"
            " lease_until = NULL WHERE lease_owner = ?",
            (owner,),
        )


# ---- a scheduler's start: runs cut off before their turns ended -----------------------------

RETRIED = "run again"  # outcome of an interrupted run that a scheduler's start ran once more
NOT_RETRIED = "not run again"


def recover(
    store: Store,
    owner: str,
    pid: int,
    now: float,
    grace_s: float,
    *,
    review_again: float,
    modes: tuple[str, ...] | None = None,
    zone: str | None = None,
) -> Recovered:
    """At a scheduler's start, in one transaction: every run left `running` by a process that
    is gone (its lease's process on this host has ended, or its lease expired) is marked
    interrupted; then each job (of those `modes`) whose latest run was interrupted and not yet
    dealt with is run once more now, late and saying why, leased to `owner`; unless its turn
    had in fact finished (the row only missed its end), it was cancelled, it is past the
    grace, its catch_up is skip, or its next instant is due now anyway. The nightly review
    tries again at `review_again`, as when it is skipped for a running turn."""
    fires: list[Fire] = []
    lost: list[Lost] = []
    with store.transaction() as c:
        _close_orphans(c, now, modes)
        rows = c.execute(
            "SELECT r.id AS run_id, r.due AS run_due, r.detail AS run_detail, j.* FROM job_runs r"
            " JOIN jobs j ON j.id = r.job_id WHERE r.status = 'interrupted' AND r.outcome IS"
            " NULL AND r.id = (SELECT MAX(id) FROM job_runs WHERE job_id = r.job_id)"
            + _of_modes(modes)
            + " ORDER BY r.id"
            + row_lock(c),
            modes or (),
        ).fetchall()
        for row in rows:
            job, run_id, due = _job(row), row["run_id"], row["run_due"]
            finished = None if job.builtin else _turn_status(c, job, run_id)
            if finished in ("done", "failed"):  # ended; the scheduler died before recording it
                c.execute(
                    "UPDATE job_runs SET status = ?, outcome = 'finished', detail = ? WHERE id = ?",
                    (finished, _joined(row["run_detail"], "its turn had ended"), run_id),
                )
                continue
            why = _not_again(job, due, now, grace_s, zone)
            if job.builtin and job.status == "active":
                c.execute(
                    "UPDATE jobs SET next_run = ? WHERE id = ? AND (next_run IS NULL OR"
                    " next_run > ?)",
                    (review_again, job.id, review_again),
                )
                local = dt.datetime.fromtimestamp(review_again, job.schedule.zone())
                why = f"it tries again at {local:%H:%M}"
            outcome = RETRIED if why is None else NOT_RETRIED
            if why is None:
                fire = _fire(c, job, owner, pid, now, due, _late(job, run_id, due, row, zone))
                fires.append(fire)
                why = f"run again as run {fire.run_id}"
            elif job.mode == "reminder" and job.status != "cancelled":
                lost.append(Lost(job, due, f"its turn was cut off before it ended; {why}"))
            c.execute(
                "UPDATE job_runs SET outcome = ?, detail = ? WHERE id = ?",
                (outcome, _joined(row["run_detail"], why), run_id),
            )
            c.execute("UPDATE jobs SET last_outcome = 'interrupted' WHERE id = ?", (job.id,))
    return Recovered(fires, lost)


def _close_orphans(c: sqlite3.Connection, now: float, modes: tuple[str, ...] | None) -> None:
    """Runs (of jobs of `modes`: those this scheduler runs again) whose scheduler is gone
    (`_orphan`): interrupted, and their job's lease given back."""
    rows = c.execute(
        "SELECT r.id, r.owner AS run_owner, j.id AS job_id, j.lease_owner, j.lease_host,"
        " j.lease_pid, j.lease_until FROM job_runs r JOIN jobs j ON j.id = r.job_id"
        " WHERE r.status = 'running'" + _of_modes(modes),
        modes or (),
    ).fetchall()
    for row in rows:
        if not _orphan(row, now):
            continue  # its scheduler still runs it
        c.execute(
            "UPDATE job_runs SET status = 'interrupted', ended = ?, detail = ? WHERE id = ?",
            (now, CRASHED, row["id"]),
        )
        if row["lease_owner"] is not None and row["lease_owner"] == row["run_owner"]:
            c.execute(
                "UPDATE jobs SET lease_owner = NULL, lease_host = NULL, lease_pid = NULL,"
                " lease_until = NULL WHERE id = ? AND lease_owner = ?",
                (row["job_id"], row["run_owner"]),
            )


def _orphan(row: sqlite3.Row, now: float) -> bool:
    """Whether a running run's scheduler is gone: its job's lease is another's, or free
    (liveness as leases read it: its process on this host ended, or its lease expired; never
    time alone on this host)."""
    held = row["lease_owner"] is not None and row["lease_owner"] == row["run_owner"]
    return not held or _lease_free(row, now)


def left_to_recover(store: Store, now: float, modes: tuple[str, ...] | None = None) -> bool:
    """Whether a scheduler that keeps running has what a start would `recover`: a run left
    running by a scheduler that is gone (another serve's, killed), or a job's latest run
    interrupted and not yet dealt with (a serve stopped mid-run). What a running scheduler
    asks on every tick: one read of the partial index of runs without an outcome (m027:
    those running, and those waiting for this), joined by primary key."""
    rows = store.query(
        "SELECT r.status, r.owner AS run_owner, j.lease_owner, j.lease_host, j.lease_pid,"
        " j.lease_until, r.id = (SELECT MAX(id) FROM job_runs WHERE job_id = r.job_id) AS"
        " latest FROM job_runs r JOIN jobs j ON j.id = r.job_id WHERE r.outcome IS NULL"
        + _of_modes(modes),
        modes or (),
    )
    for row in rows:
        if row["status"] == "running" and _orphan(row, now):
            return True
        if row["status"] == "interrupted" and row["latest"]:
            return True
    return False


def _turn_status(c: sqlite3.Connection, job: Job, run_id: int) -> str | None:
    """The status of the turn that carried run `run_id` (its message's meta names the run),
    None if it never began. Candidates are found by the id in the meta's text, then read."""
    rows = c.execute(
        "SELECT t.status, m.meta FROM turns t JOIN messages m ON m.id = t.user_message_id"
        " JOIN conversations v ON v.id = t.conversation_id WHERE v.key = ? AND m.meta LIKE ?",
        (job.key, f'%"{RUN_META}": "{run_id}"%'),
    ).fetchall()
    for row in rows:
        try:
            meta = json.loads(row["meta"])
        except ValueError:
            continue
        if isinstance(meta, dict) and meta.get(RUN_META) == str(run_id):
            return str(row["status"])
    return None


def _not_again(job: Job, due: float, now: float, grace_s: float, zone: str | None) -> str | None:
    """Why a cut-off run is not run once more (None: it is)."""
    if job.status == "cancelled":
        return "the job was cancelled"
    if job.status == "paused":
        return "the job is paused"
    if job.catch_up == "skip":
        return "catch_up = skip"
    if now - due > grace_s:
        return f"due {_when(due, job, zone)}, past the grace period"
    if job.next_run is not None and job.next_run <= now:
        return "its next instant is due now and runs instead"
    return None


def _late(job: Job, run_id: int, due: float, row: sqlite3.Row, zone: str | None) -> str:
    """What the run again says (its run row's detail, and the line its prompt opens with)."""
    how = "it stopped" if STOPPED in (row["run_detail"] or "") else "it was killed or crashed"
    return (
        f"late: due {_when(due, job, zone)}; its run {run_id} was cut off before its turn ended"
        f" (the serve running it stopped: {how}), so it runs once more now"
    )


def _joined(*parts: str | None) -> str | None:
    return "; ".join(p for p in parts if p) or None


# ---- periodic ticks (the heartbeat) ---------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    name: str
    last: float
    outcome: str | None
    detail: str | None


def tick(store: Store, name: str) -> Tick | None:
    rows = store.query("SELECT * FROM ticks WHERE name = ?", (name,))
    return Tick(name, rows[0]["last"], rows[0]["outcome"], rows[0]["detail"]) if rows else None


def claim_tick(store: Store, name: str, owner: str, now: float, period: float) -> bool:
    """Take this period's tick: True once per `period` across processes. Ticks missed while
    nothing ran coalesce into this one. The first call only starts the count."""
    with store.transaction() as c:
        row = c.execute("SELECT last FROM ticks WHERE name = ?" + row_lock(c), (name,)).fetchone()
        if row is None:
            c.execute(  # OR IGNORE: a second process's first call, at the same moment
                "INSERT OR IGNORE INTO ticks (name, last, owner, outcome)"
                " VALUES (?, ?, ?, 'started')",
                (name, now, owner),
            )
            return False
        if now - row["last"] < period:
            return False
        c.execute(
            "UPDATE ticks SET last = ?, owner = ?, outcome = 'running', detail = NULL"
            " WHERE name = ?",
            (now, owner, name),
        )
        return True


def end_tick(store: Store, name: str, outcome: str, detail: str | None = None) -> None:
    with store.transaction() as c:
        c.execute(
            "UPDATE ticks SET outcome = ?, detail = ? WHERE name = ?", (outcome, detail, name)
        )
