"""`heron jobs run-now` when no `heron serve` runs: the job's asked run, run in this process.

The run is the one a serve's scheduler would make (heron/proactive/scheduler.py: the same
message to the model, the same row in the job's runs), on an AgentLoop of this process
(heron/channels/inprocess.py). What it says is printed as `heron run` prints a reply (the reply
on stdout, tool lines and notices on stderr); a monitor says nothing unless it messages you.
The run's outcome, as its row records it, ends the output, and the exit status follows it.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import TextIO

from heron.config import Settings
from heron.store.jobs import JobRun


async def run_job_here(
    settings: Settings, job_id: int, out: TextIO | None = None, err: TextIO | None = None
) -> bool:
    """Ask job `job_id` to run now (`jobs.request_run`) once the model is open, and run it
    here; True when its run is recorded done."""
    from heron.agent.engine import Engine
    from heron.channels.inprocess import connect
    from heron.channels.script import EMBEDDED_BANNER, ReplyPrinter, approve_in_terminal
    from heron.proactive.background import run_asked_here
    from heron.proactive.scheduler import CHANNEL
    from heron.store import jobs

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    printer = ReplyPrinter(out, err)
    async with Engine.open(settings, one_shot=True) as engine:
        await engine.store.call(jobs.request_run, engine.store, job_id, time.time())
        if engine.choice.embedded:
            printer.note(EMBEDDED_BANNER)
        approve = functools.partial(approve_in_terminal, err)
        opened = connect(
            engine, CHANNEL, f"job-{job_id}", printer.deliver, idle=False, approve=approve
        )
        async with opened as conn:
            ran = await run_asked_here(conn.loop, engine, job_id, conn.settle)
        latest = await engine.store.call(jobs.runs, engine.store, job_id, 1)
    if printer.hold:  # stdout is no terminal: the reply as stored, whole
        printer.emit("".join(printer.reply))
    if printer.wrote and not printer.at_line_start:
        printer.emit("\n")
    if not ran or not latest:
        printer.note(
            f"heron: another Heron process took job {job_id}'s run first; "
            f"heron jobs runs {job_id} shows how it went."
        )
        return False
    printer.note(outcome_line(latest[0]))
    return latest[0].status == "done"


def outcome_line(run: JobRun) -> str:
    """The run's end as recorded: `heron: job 3 ran here: done (delivered).`"""
    how = run.status if run.outcome in (None, run.status) else f"{run.status} ({run.outcome})"
    line = f"heron: job {run.job_id} ran here: {how}."
    if run.detail:
        line += f" {run.detail}"
    if run.status != "done":
        line += f"\nheron jobs runs {run.job_id} lists its runs."
    return line
