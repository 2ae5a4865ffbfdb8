"""`heron jobs ...`: list, show, add, pause, resume, run now and cancel scheduled jobs, and read
what each run did.

Pause, resume, run-now and cancel write the job's row, then tell a running serve over its control
socket (`jobs_changed`) so its scheduler looks at once, not at its next poll. The nightly
review's row is listed apart from the person's jobs and cannot be cancelled here (pause it, or
turn it off in config.toml).

The rows live in the store (heron/store/jobs.py); the scheduler of `heron serve` fires them
(`run-now` with no serve runs the job here: heron/channels/jobs_here.py).
Adding a job while no `heron serve` runs saves it and says it waits for one; adding one to a
conversation that does not exist yet says its first run opens it (a typo shows at once).
Every time is shown in the agent's zone (`[agent] timezone`, heron/timefmt.py), unnamed in a
table and named on a line of its own, whatever zone a job was made in. A cron job keeps firing by
the clock of the zone it was made in: where that is not the agent's zone, the list and `show`
say so, and how to move it (`set-zone`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from heron import timefmt
from heron.channels.common import conversation_key, echo, table
from heron.errors import ConfigError, HeronError, one_line

if TYPE_CHECKING:
    from heron.config import Settings
    from heron.store import Store
    from heron.store.jobs import Job, JobRun

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Scheduled jobs: list, show, add, pause, resume, set-zone, run-now, cancel, runs.",
    no_args_is_help=True,
)


def _fail(error: HeronError) -> NoReturn:
    echo(f"heron: {error}", err=True)
    raise typer.Exit(2 if isinstance(error, ConfigError) else 1)


@contextmanager
def _open() -> Iterator[tuple[Settings, Store]]:
    from heron.config import Settings
    from heron.store import Store

    try:
        settings = Settings.load()
        store = Store(settings.database)
    except HeronError as e:
        _fail(e)
    try:
        yield settings, store
    except HeronError as e:
        _fail(e)
    finally:
        store.close()


def _local(instant: float | None, zone: str, *, named: bool = False) -> str:
    """`instant` in the agent's `zone`: named when shown alone, not in a table's cell."""
    return "-" if instant is None else timefmt.when(instant, zone, named=named)


def _short(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _next(job: Job, zone: str, now: float, *, named: bool = False) -> str:
    """When it fires next, in the agent's `zone`: a paused job's instant is only a resume's; a
    due one whose run still goes waits for it."""
    from heron.tools.schedule import next_words

    if job.status == "paused":
        return "paused"
    return "-" if job.next_run is None else next_words(job, zone, now, named=named)


def other_zone(job: Job, zone: str) -> bool:
    """Whether `job` fires by another clock than the agent's `zone`: a cron job made before the
    zone changed keeps the zone it was made in (an interval or a one-off time is an instant,
    the same in every zone)."""
    return job.schedule.kind == "cron" and job.schedule.timezone != zone


def zone_note(job: Job, zone: str) -> str:
    """What the list says under a job that fires by another zone's clock, and how to move it."""
    return (
        # Not "the zone it was made in": after `set-zone ZONE` it is the zone it was moved to.
        f"Job {job.id}'s cron reads its times in {job.schedule.timezone}, not in {zone} (NEXT "
        f"is in {zone}). To move it to {zone}: heron jobs set-zone {job.id}"
    )


def job_rows(jobs: list[Job], zone: str, now: float) -> list[tuple[str, ...]]:
    from heron.tools.schedule import damaged

    return [
        (
            str(j.id),
            j.mode,
            "damaged" if damaged(j) else j.status,
            j.schedule.describe(),
            _next(j, zone, now),
            j.conversation,
            f"running (run {j.running_run})" if j.running_run else j.last_outcome or "-",
            _short(j.prompt),
        )
        for j in jobs
    ]


def review_line(job: Job, zone: str, now: float) -> str:
    """The built-in nightly review, on a line of its own under the person's jobs: its id is
    not one of theirs, and it is paused or turned off otherwise than a job of theirs. Its
    schedule follows the agent's `zone` (`sync_review`), which its description names."""
    from heron.tools.schedule import last_words

    state = {"cancelled": "off ([review] enabled = true turns it on)", "paused": "paused"}
    said = state.get(job.status, f"next {_next(job, zone, now)}")
    last = last_words(job, zone, named=False)
    last = f", {last}" if last else ""
    how = f"heron jobs resume {job.id}" if job.status == "paused" else f"heron jobs pause {job.id}"
    if job.status == "cancelled":
        how = "[review] in config.toml"
    return (
        f"Built-in: the nightly review of memory (job {job.id}), {job.schedule.describe()}:"
        f" {said}{last}. ({how})"
    )


JOB_HEADER = ("ID", "MODE", "STATUS", "SCHEDULE", "NEXT", "CONVERSATION", "LAST", "PROMPT")
NEW_CONVERSATION = (
    "Conversation {key!r} does not exist yet: the job's first run opens it "
    "(heron conversations list shows those there are)."
)


@app.command("list")
def list_(
    every: Annotated[
        bool, typer.Option("--all", help="Include finished and cancelled jobs.")
    ] = False,
) -> None:
    """List scheduled jobs, soonest first."""
    from heron.proactive.review import JOB_PROMPT, job_schedule
    from heron.store import jobs
    from heron.tools.schedule import DAMAGED, damaged

    with _open() as (settings, store):
        # The built-in review's row as config.toml has it now, as serve will when it starts.
        when, enabled = job_schedule(settings.config)
        jobs.sync_review(store, when, enabled, time.time(), JOB_PROMPT)
        found = jobs.list_jobs(store, everything=every)
        mine, zone = [j for j in found if not j.builtin], settings.timezone
        if mine:
            table(JOB_HEADER, job_rows(mine, zone, time.time()))
        else:
            echo("No scheduled jobs. Add one with: heron jobs add PROMPT --every 1d -c KEY")
        for job in mine:
            if damaged(job):
                echo(DAMAGED.format(id=job.id, schedule=job.schedule.describe()))
            elif other_zone(job, zone):
                echo(zone_note(job, zone))
        built = jobs.review_job(store)
        if built is not None and (every or built.status != "cancelled"):
            echo(review_line(built, zone, time.time()))


@app.command("add")
def add(
    prompt: Annotated[str, typer.Argument(help="What the job says or checks when it fires.")],
    conversation: Annotated[
        str,
        typer.Option(
            "--conversation",
            "-c",
            help="The conversation it belongs to (a reminder speaks there).",
            callback=conversation_key,
        ),
    ],
    cron: Annotated[
        str | None, typer.Option(help='A cron expression, e.g. "0 9 * * 1-5" (local time).')
    ] = None,
    every: Annotated[
        str | None, typer.Option(help='An interval: "30m", "2h", "1d" (at least 1m).')
    ] = None,
    at: Annotated[
        str | None, typer.Option(help='One local date and time: "2026-12-24 18:00".')
    ] = None,
    mode: Annotated[
        str,
        typer.Option(
            help="reminder: speaks in the conversation; monitor: silent unless it messages."
        ),
    ] = "reminder",
    catch_up: Annotated[
        str, typer.Option("--catch-up", help="A time missed while serve was down: once or skip.")
    ] = "once",
) -> None:
    """Add a job; it fires while `heron serve` runs."""
    from heron.store import jobs
    from heron.store.schedule import CLI_HINT, HINT, ScheduleError, parse, user_timezone
    from heron.tools.schedule import NOT_RUNNING, describe, serve_running

    for option, value, valid in (
        ("--mode", mode, jobs.MODES),
        ("--catch-up", catch_up, jobs.CATCH_UPS),
    ):
        if value not in valid:
            named = " or ".join(valid)
            _fail(ScheduleError(f"{option} {value!r} is unknown", hint=f"{option} is {named}."))
    with _open() as (settings, store):
        zone = user_timezone(settings.config.agent.timezone)
        try:
            when = parse(cron=cron, every=every, at=at, timezone=zone)
        except ScheduleError as e:  # the forms as this command's options write them
            raise ScheduleError(e.summary, hint=CLI_HINT if e.hint == HINT else e.hint) from e
        job = jobs.create_job(
            store, when, conversation=conversation, prompt=prompt, now=time.time(), mode=mode,
            catch_up=catch_up, created_by="cli",
        )  # fmt: skip
        echo(f"Created {describe(job, zone)}")
        if mode == "monitor" and (toolless := _toolless_model(settings)):
            echo(MONITOR_NO_TOOLS.format(id=job.id, model=toolless))
        if store.conversation(conversation) is None:
            echo(NEW_CONVERSATION.format(key=conversation))
        if not serve_running(settings.paths.home):
            echo(NOT_RUNNING)
        else:
            _tell_serve(settings)


# A monitor speaks only by calling `message`: on a model offered no tools each of its runs is
# skipped (heron/proactive/scheduler.py NO_TOOLS), which the person hears as it is made.
MONITOR_NO_TOOLS = (
    "Note: job {id} is a monitor, which reaches you only by calling the message tool, and the "
    "model in use ({model}) has no tools: its runs are skipped (heron jobs runs {id} says so) "
    'until Heron runs a model that has them (README, "Pointing Heron at a model").'
)


def _toolless_model(settings: Settings) -> str | None:
    """The model turns run with (the running serve's, else this shell's), when it is offered no
    tools; None when it has them or is not known (a serve on another model than this shell
    names: only the offline one's name says it has none)."""
    from heron.agent.engine import offers_tools
    from heron.config import EMBEDDED_MODEL
    from heron.store.home_lock import read_info, serve_holder

    try:
        choice = settings.model()
    except HeronError:  # no model at all: `heron serve` says so when it starts
        return None
    named = f"{choice.provider}/{choice.model}"
    info = read_info(settings.paths.home) if serve_holder(settings.paths.home) else None
    if info is not None and info.model and info.model != named:
        return info.model if info.model == f"local/{EMBEDDED_MODEL}" else None
    return None if offers_tools(choice) else named


JobId = Annotated[int, typer.Argument(help="The job's id (heron jobs list).")]


def _known(store: Store, job_id: int) -> Job:
    from heron.store import jobs
    from heron.store.schedule import ScheduleError

    found = jobs.get_job(store, job_id)
    if found is None:
        _fail(ScheduleError(f"there is no job {job_id}", hint="heron jobs list shows them."))
    return found


def _tell_serve(settings: Settings) -> None:
    """A running serve's scheduler looks now rather than at its next poll (up to 30 s)."""
    from heron.channels.remote import serve_jobs_changed

    serve_jobs_changed(settings.paths.home)


@app.command("cancel")
def cancel(
    job_ids: Annotated[
        list[int] | None,
        typer.Argument(help="The jobs' ids (heron jobs list).", show_default=False),
    ] = None,
    conversation: Annotated[
        str | None,
        typer.Option(
            "--conversation",
            "-c",
            help="Every active or paused job of this conversation.",
            callback=conversation_key,
        ),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Every active or paused job.")] = False,
) -> None:
    """Cancel jobs for good: by id (several at once), a conversation's, or all; a run already
    started finishes. (Not the nightly review: pause it, or turn it off in config.toml.)"""
    from heron.store import jobs
    from heron.store.schedule import ScheduleError

    if sum((bool(job_ids), conversation is not None, every)) != 1:
        _fail(ScheduleError(CANCEL_WHICH, hint=CANCEL_HINT))
    with _open() as (settings, store):
        if job_ids:
            picked = job_ids
        else:  # the person's jobs only: the nightly review is not among "all"
            found = jobs.list_jobs(store, conversation=conversation)
            picked = [j.id for j in found if not j.builtin]
            if not picked:
                where = f" in conversation {conversation!r}" if conversation else ""
                echo(f"No active or paused jobs{where}.")
                return
        refused = [why for job_id in picked if (why := _cancel_one(store, settings, job_id))]
        _tell_serve(settings)
    if refused:  # each said, after the others were cancelled
        _fail(refused[0] if len(refused) == 1 else ScheduleError("; ".join(map(str, refused))))


CANCEL_WHICH = "say which jobs to cancel: their ids, --conversation KEY, or --all"
CANCEL_HINT = "heron jobs cancel 3 4 7, heron jobs cancel -c personal, heron jobs cancel --all"


def _cancel_one(store: Store, settings: Settings, job_id: int) -> HeronError | None:
    """One job cancelled, or said to have ended already; the refusal when it cannot be."""
    from heron.store import jobs
    from heron.store.schedule import ScheduleError
    from heron.tools.schedule import BUILTIN_CANCEL, BUILTIN_HINT, describe

    before = jobs.get_job(store, job_id)
    if before is None:
        return ScheduleError(f"there is no job {job_id}", hint="heron jobs list shows them.")
    if before.builtin:  # its id sits among the person's: a cancel of it is refused
        return ScheduleError(BUILTIN_CANCEL.format(id=job_id), hint=BUILTIN_HINT.format(id=job_id))
    if before.status not in ("active", "paused"):
        was = "already done" if before.status == "done" else "already cancelled"
        echo(f"Job {job_id} was {was}: {describe(before, settings.timezone)}")
        return None
    job = jobs.cancel_job(store, job_id)
    assert job is not None
    echo(f"Cancelled {describe(job, settings.timezone)}")
    return None


JobIds = Annotated[
    list[int], typer.Argument(help="The jobs' ids (heron jobs list), one or several.")
]


@app.command("pause")
def pause(job_ids: JobIds) -> None:
    """Pause jobs: each fires nothing until `heron jobs resume`, across restarts.

    Several ids at once, as cancel takes them; an unknown id is refused before any job is
    paused. The times that pass meanwhile are not made up. A run already started finishes."""
    from heron.store import jobs
    from heron.tools.schedule import describe

    with _open() as (settings, store):
        for job_id in job_ids:
            _known(store, job_id)
        for job_id in job_ids:
            done = jobs.pause_job(store, job_id)
            if not done.changed:
                echo(f"Job {job_id} was already paused: {describe(done.job, settings.timezone)}")
                continue
            echo(f"Paused {describe(done.job, settings.timezone)}")
            echo(f"It fires nothing until: heron jobs resume {job_id}")
        _tell_serve(settings)


@app.command("resume")
def resume(job_ids: JobIds) -> None:
    """Resume paused jobs from now: the times they were paused over are not made up.

    Several ids at once; an unknown id is refused before any job is resumed."""
    from heron.store import jobs
    from heron.tools.schedule import describe, resumed

    with _open() as (settings, store):
        for job_id in job_ids:
            _known(store, job_id)
        for job_id in job_ids:
            done = jobs.resume_job(store, job_id, time.time())
            if not done.changed:
                echo(f"Job {job_id} is not paused: {describe(done.job, settings.timezone)}")
                continue
            echo(resumed(done.job, settings.timezone))
        _tell_serve(settings)


@app.command("set-zone")
def set_zone(
    job_id: JobId,
    zone: Annotated[
        str | None,
        typer.Argument(help="An IANA zone such as Europe/Berlin; the agent's zone if left out."),
    ] = None,
) -> None:
    """Move a cron job to another zone's clock: the agent's zone if none is given.

    From now on "every day at 9" fires at 9 there (you moved); its schedule, prompt, status and
    runs stay."""
    from heron.store import jobs
    from heron.tools.schedule import describe

    with _open() as (settings, store):
        _known(store, job_id)
        target = settings.timezone if zone is None else _zone_named(zone)
        done = jobs.move_zone(store, job_id, target, time.time())
        if not done.changed:
            echo(f"Job {job_id} already reads its times in {target}.")
            return
        _tell_serve(settings)
        echo(f"Moved {describe(done.job, settings.timezone)}")


def _zone_named(name: str) -> str:
    """An IANA zone as typed, or the one it means with its case slipped ("europe/berlin");
    refused, with a hint for this command, when there is none."""
    from zoneinfo import available_timezones

    from heron.store.schedule import ScheduleError

    zones = available_timezones()
    if name in zones:
        return name
    slipped = [z for z in zones if z.lower() == name.lower()]
    if len(slipped) == 1:
        return slipped[0]
    _fail(
        ScheduleError(
            f"unknown timezone {name!r}",
            hint="Give an IANA name such as Europe/Berlin or America/New_York (an offset like "
            "UTC+2 follows no daylight saving: Etc/GMT-2 is UTC+2 all year).",
        )
    )


@app.command("run-now")
def run_now(job_id: JobId) -> None:
    """Run a job once now, as an ordinary fire (in its runs, in its conversation), without
    moving its schedule; a done one-shot reminder too.

    A running `heron serve` runs it; with none, it runs here, and its reply is printed as
    `heron run` prints one."""
    from heron.channels.remote import serve_jobs_changed
    from heron.store import jobs
    from heron.tools.schedule import asked

    with _open() as (settings, store):
        job = _known(store, job_id)
        here = job.status != "cancelled" and not serve_jobs_changed(settings.paths.home)
        if not here:  # (a cancelled job is refused by name)
            done = jobs.request_run(store, job_id, time.time())
            serve_jobs_changed(settings.paths.home)
            echo(asked(done))
    if here:
        _run_here(settings, job_id)


def _run_here(settings: Settings, job_id: int) -> NoReturn:
    """No serve took the run: run it in this process, exit 0 when its run is done."""
    import asyncio

    from heron.channels.jobs_here import run_job_here

    echo(f"heron: no heron serve is running: job {job_id} runs here, now.", err=True)
    try:
        ok = asyncio.run(run_job_here(settings, job_id))
    except HeronError as e:  # the model cannot be opened, the job is running: nothing ran
        _fail(e)
    raise typer.Exit(0 if ok else 1)


@app.command("show")
def show(job_id: JobId) -> None:
    """Everything about one job: state, schedule, zone, next time, conversation, prompt, and
    its last runs."""
    from heron.store import jobs

    with _open() as (settings, store):
        job = _known(store, job_id)
        echo("\n".join(show_lines(job, time.time(), settings.timezone)))
        found = jobs.runs(store, job_id, SHOWN_RUNS)
        if not found:
            echo("No runs yet.")
            return
        echo(f"Last runs (newest first; heron jobs runs {job_id} shows more):")
        table(RUN_HEADER, run_rows(found, settings.timezone))


SHOWN_RUNS = 5


def show_lines(job: Job, now: float, zone: str) -> list[str]:
    """Every line of `heron jobs show` but its runs; each time alone, so named, in the agent's
    `zone`."""
    from heron.tools.schedule import DAMAGED, damaged

    what = "the built-in nightly review of memory" if job.builtin else job.mode
    lines = [f"Job {job.id}: {what}, {job.status}"]
    if damaged(job):
        lines.append(DAMAGED.format(id=job.id, schedule=job.schedule.describe()))
    when = _next(job, zone, now, named=True)
    if job.status == "paused":
        again = job.schedule.next_after(now, base=job.next_run)
        when = f"- (paused; resumed now, next {_local(again, zone, named=True)})"
    rows = [("schedule", job.schedule.describe()), ("zone", _zone_line(job, zone)), ("next", when)]
    if job.run_now is not None:
        asked = _local(job.run_now, zone, named=True)
        rows.append(("asked", f"to run now at {asked}, not started yet"))
    if not job.builtin:
        where = job.conversation
        if job.mode == "monitor":
            where += f" (its checks run silently in {job.key})"
        rows.append(("conversation", where))
    rows += [
        ("catch-up", job.catch_up),
        ("made", f"{_local(job.created, zone, named=True)} by {job.created_by}"),
        ("last run", _last_run(job, zone)),
    ]
    lines += [f"  {name + ':':<14}{value}" for name, value in rows]
    lines.append("Prompt:")
    lines += [f"  {line}" for line in job.prompt.splitlines() or [""]]
    return lines


def _last_run(job: Job, zone: str) -> str:
    """`show`'s last run: when it started and what came of it; while a run goes, that one,
    running (its start is `last_run`, but the job's outcome is still the run before's)."""
    from heron.tools.schedule import last_words

    if job.running_run is not None:
        before = f"; the run before: {job.last_outcome}" if job.last_outcome else ""
        return f"{last_words(job, zone)}{before}"
    return f"{_local(job.last_run, zone, named=True)}, {job.last_outcome or '-'}"


@app.command("runs")
def runs(
    job_id: Annotated[int | None, typer.Argument(help="Only this job's runs.")] = None,
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 30,
) -> None:
    """What each run did: fired, skipped (and why), interrupted, failed."""
    from heron.store import jobs
    from heron.store.schedule import ScheduleError

    with _open() as (settings, store):
        if job_id is not None and jobs.get_job(store, job_id) is None:
            _fail(ScheduleError(f"there is no job {job_id}", hint="heron jobs list shows them."))
        found = jobs.runs(store, job_id, limit)
        if not found:
            echo("No runs yet.")
            return
        table(RUN_HEADER, run_rows(found, settings.timezone))


RUN_HEADER = ("RUN", "JOB", "DUE", "STARTED", "STATUS", "OUTCOME", "DETAIL")


def run_rows(found: list[JobRun], zone: str) -> list[tuple[str, ...]]:
    """The runs, every time in the agent's `zone`: one column, one clock."""
    return [
        (
            str(r.id),
            str(r.job_id),
            _local(r.due, zone),
            _local(r.started, zone),
            r.status,
            r.outcome or "-",
            one_line(r.detail or ""),  # a failure's error and hint: one cell, one row
        )
        for r in found
    ]


def _zone_line(job: Job, zone: str) -> str:
    """`show`'s zone: the job's own, and whether its cron fires by another clock than the one
    its times are shown in."""
    if not other_zone(job, zone):
        return job.schedule.timezone
    return (
        f"{job.schedule.timezone}, not {zone}: its cron fires by "
        f"{job.schedule.timezone}'s clock (the times shown here are in {zone}). To move it: "
        f"heron jobs set-zone {job.id}"
    )
