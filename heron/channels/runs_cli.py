"""`heron runs list|show|cancel`: subagents and questions that wait (heron/proactive).

A subagent's transcript is readable here and nowhere else: its conversation is internal work,
never listed among the conversations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from heron.channels.common import echo
from heron.errors import HeronError, StoreError

if TYPE_CHECKING:  # imported inside the commands at run time, so `heron --help` stays fast
    from heron.store import Store
    from heron.store.runs import Run

runs_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Subagents and questions waiting for your answer: list, show, cancel.",
    no_args_is_help=True,
)
RunArg = Annotated[str, typer.Argument(help="A run id (a unique prefix is enough).")]


def _store() -> tuple[Store, str]:
    """The home's store, and the agent's zone its times are shown in."""
    from heron.channels.common import settings
    from heron.channels.info import open_store

    s = settings()
    return open_store(s), s.timezone


def _find(store: Store, prefix: str) -> Run:
    from heron.store import runs

    found = [r for r in runs.listing(store, limit=10_000) if r.id.startswith(prefix)]
    if len(found) != 1:
        why = "no run" if not found else f"{len(found)} runs"
        raise StoreError(f"{why} matching {prefix!r}", hint="See: heron runs list")
    return found[0]


def _when(ts: float | None, zone: str, *, named: bool = False) -> str:
    from heron.timefmt import when

    return when(ts, zone, named=named) if ts else "-"


def _fail(error: HeronError) -> None:
    from heron.channels.common import fail

    fail(error)


def _what(run: Run) -> str:  # the task, or the question
    line = " ".join(run.task.split())
    return line if len(line) <= 60 else line[:59] + "…"


@runs_app.command("list")
def runs_list(
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 30,
) -> None:
    """Subagent runs and questions, newest first, with their status."""
    from heron.store import runs

    store, zone = _store()
    rows = runs.listing(store, limit=limit)
    if not rows:
        echo("No runs yet. The agent starts them with its spawn and ask_user tools.")
        return
    from heron.channels.common import table

    lines = []
    for r in rows:
        status = r.status + (" (partial)" if r.partial else "")
        started = _when(r.created, zone)
        if r.kind == "ask" and r.status == "waiting" and r.deadline:
            status += f" until {_when(r.deadline, zone)}"
        elif r.kind == "subagent" and r.status == "waiting":  # for a slot: not started yet
            status = runs.waiting_for_slot(store, r)
            started = "-"
        lines.append((r.id, r.kind, status, r.origin_key, started, _what(r)))
    table(("ID", "KIND", "STATUS", "FOR", "STARTED", "TASK"), lines)


@runs_app.command("show")
def runs_show(run_id: RunArg) -> None:
    """A run's status and result, and a subagent's whole transcript."""
    from heron.channels.info import render_message

    store, zone = _store()
    try:
        run = _find(store, run_id)
    except HeronError as e:
        _fail(e)
        return
    echo(f"run:      {run.id} ({run.kind})\nstatus:   {run.status}")
    started, ended = _when(run.created, zone, named=True), _when(run.finished, zone, named=True)
    echo(f"for:      {run.origin_key}\nstarted:  {started}")
    echo(f"ended:    {ended}\n{'question' if run.kind == 'ask' else 'task'}:")
    echo(f"  {run.task}")
    if run.kind == "subagent":
        conv = store.conversation(run.conversation_key) if run.conversation_key else None
        if conv is None:
            echo("transcript: (no longer kept: lineages are kept 6 hours, 3 each)")
        else:
            echo(f"transcript ({conv.key}):")
            for row in store.branch(conv.id):
                for line in render_message(row.message, row.author, meta=row.meta):
                    echo(f"  {line}")
    if run.result:
        label = "result (partial)" if run.partial else "result"
        echo(f"{label}:\n  {run.result}")


@runs_app.command("cancel")
def runs_cancel(run_id: RunArg) -> None:
    """Stop a running subagent, or drop a question waiting for your answer."""
    from heron.store import runs

    store, _ = _store()
    try:
        run = _find(store, run_id)
    except HeronError as e:
        _fail(e)
        return
    echo(runs.cancel_by_person(store, run)[1])
