"""`heron jobs ...`: list, add and cancel scheduled jobs, and read what each run did.

The rows live in the store (heron/store/jobs.py); the scheduler of `heron serve` fires them.
Adding a job while no `heron serve` runs saves it and says it waits for one; adding one to a
conversation that does not exist yet says its first run opens it (a typo shows at once).
Times are shown in the agent's zone (`[agent] timezone`), named in the tables' headers.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from heron.channels.common import table
from heron.errors import ConfigError, HeronError

if TYPE_CHECKING:
    from heron.config import Settings
    from heron.store import Store
    from heron.store.jobs import Job

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Scheduled jobs: list, add, cancel, and the record of their runs.",
    no_args_is_help=True,
)


def _fail(error: HeronError) -> NoReturn:
    typer.echo(f"heron: {error}", err=True)
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


def _local(instant: float | None, zone: str) -> str:
    if instant is None:
        return "-"
    from heron.store.schedule import zone_of

    return f"{dt.datetime.fromtimestamp(instant, zone_of(zone)):%Y-%m-%d %H:%M}"


def _short(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def job_rows(jobs: list[Job]) -> list[tuple[str, ...]]:
    return [
        (
            str(j.id),
            "review (built-in)" if j.builtin else j.mode,
            "disabled" if j.builtin and j.status == "cancelled" else j.status,
            j.schedule.describe(),
            _local(j.next_run, j.schedule.timezone),
            "-" if j.builtin else j.conversation,
            j.last_outcome or "-",
            _short(j.prompt),
        )
        for j in jobs
    ]


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

    with _open() as (settings, store):
        # The built-in review's row as config.toml has it now, as serve will when it starts.
        when, enabled = job_schedule(settings.config)
        jobs.sync_review(store, when, enabled, time.time(), JOB_PROMPT)
        found = jobs.list_jobs(store, everything=every)
        if not found:
            typer.echo("No scheduled jobs. Add one with: heron jobs add PROMPT --every 1d -c KEY")
            return
        table(JOB_HEADER, job_rows(found))


@app.command("add")
def add(
    prompt: Annotated[str, typer.Argument(help="What the job says or checks when it fires.")],
    conversation: Annotated[
        str,
        typer.Option(
            "--conversation", "-c", help="The conversation it belongs to (a reminder speaks there)."
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
    from heron.store.schedule import ScheduleError, parse, user_timezone
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
        when = parse(cron=cron, every=every, at=at, timezone=zone)
        job = jobs.create_job(
            store, when, conversation=conversation, prompt=prompt, now=time.time(), mode=mode,
            catch_up=catch_up, created_by="cli",
        )  # fmt: skip
        typer.echo(f"Created {describe(job)}")
        if store.conversation(conversation) is None:
            typer.echo(NEW_CONVERSATION.format(key=conversation))
        if not serve_running(settings.paths.home):
            typer.echo(NOT_RUNNING)


@app.command("cancel")
def cancel(job_id: Annotated[int, typer.Argument(help="The job's id (heron jobs list).")]) -> None:
    """Cancel a job; a run already started finishes."""
    from heron.store import jobs
    from heron.store.schedule import ScheduleError
    from heron.tools.schedule import BUILTIN_CANCEL, describe

    with _open() as (_, store):
        before = jobs.get_job(store, job_id)
        job = jobs.cancel_job(store, job_id)
        if before is None or job is None:
            _fail(ScheduleError(f"there is no job {job_id}", hint="heron jobs list shows them."))
        if before.status != "active":
            was = "already done" if before.status == "done" else "already cancelled"
            if before.builtin and before.status == "cancelled":
                was = "already disabled"
            typer.echo(f"Job {job_id} was {was}: {describe(job)}")
            return
        if job.builtin:
            typer.echo(BUILTIN_CANCEL.format(id=job.id))
            return
        typer.echo(f"Cancelled {describe(job)}")


@app.command("runs")
def runs(
    job_id: Annotated[int | None, typer.Argument(help="Only this job's runs.")] = None,
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 30,
) -> None:
    """What each run did: fired, skipped (and why), interrupted, failed."""
    from heron.store import jobs
    from heron.store.schedule import ScheduleError

    with _open() as (_, store):
        if job_id is not None and jobs.get_job(store, job_id) is None:
            _fail(ScheduleError(f"there is no job {job_id}", hint="heron jobs list shows them."))
        found = jobs.runs(store, job_id, limit)
        if not found:
            typer.echo("No runs yet.")
            return
        zones = {j.id: j.schedule.timezone for j in jobs.list_jobs(store, everything=True)}
        rows = [
            (
                str(r.id),
                str(r.job_id),
                _local(r.due, zones.get(r.job_id, "UTC")),
                _local(r.started, zones.get(r.job_id, "UTC")),
                r.status,
                r.outcome or "-",
                r.detail or "",
            )
            for r in found
        ]
        table(("RUN", "JOB", "DUE", "STARTED", "STATUS", "OUTCOME", "DETAIL"), rows)
