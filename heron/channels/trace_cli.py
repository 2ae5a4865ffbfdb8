"""`heron trace ls|show|export|replay` and `heron usage`.

Registered in heron/cli.py; everything heavy is imported inside the commands so `heron --help`
stays fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from heron.channels.common import echo
from heron.errors import HeronError, StoreRefused

if TYPE_CHECKING:  # imported inside the commands at run time, so `heron --help` stays fast
    from pathlib import Path

    from heron.config import Settings
    from heron.store import Store, Turn
    from heron.tools.registry import ToolRegistry
    from heron.trace.prices import PriceTable

trace_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Recorded runs: list, show, export and replay them.",
    no_args_is_help=True,
)

RunArg = Annotated[
    str, typer.Argument(help="A run id (a unique prefix is enough) from `heron trace ls`.")
]


def _fail(error: HeronError) -> None:
    from heron.channels.common import fail

    fail(error)


def _cost_notes(turns: list[Turn], prices: PriceTable) -> None:
    """Why a cost shown is `?`, and how to price its model: on stderr, so that stdout stays
    the listing a script reads."""
    from heron.trace.render import unknown_cost_notes

    for note in unknown_cost_notes(turns, prices):
        echo(note, err=True)


def _open() -> tuple[Settings, Store, PriceTable]:
    from heron.channels.common import reading_settings
    from heron.store import Store
    from heron.store.engine_state import close_dead_runs
    from heron.trace.prices import PriceTable

    s = reading_settings()  # only the record is read: a broken config.toml is said, not fatal
    store = Store(s.database)
    with contextlib.suppress(StoreRefused):  # a home that refuses writes is still listed
        close_dead_runs(store)  # a run whose process was killed shows interrupted, not running
    return s, store, PriceTable.from_config(s.config.prices)


@trace_app.command("ls")
def trace_ls(
    conversation: Annotated[
        str | None, typer.Option("--conversation", "-c", help="Only this conversation's runs.")
    ] = None,
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 30,
) -> None:
    """List recorded runs, newest first."""
    from heron.channels.common import table
    from heron.trace.read import list_runs
    from heron.trace.render import LS_HEADER, ls_rows

    try:
        s, store, prices = _open()
        runs = list_runs(store, conversation, limit)
        rows = ls_rows(runs, prices, s.timezone)
        if not rows:
            echo("No runs recorded yet.")
        else:
            table(LS_HEADER, rows)
            _cost_notes([r.turn for r in runs], prices)
    except HeronError as e:
        _fail(e)


@trace_app.command("show")
def trace_show(
    run: Annotated[
        str,
        typer.Argument(help="A run id (or unique prefix); with --stats also a conversation key."),
    ],
    stats: Annotated[
        bool, typer.Option("--stats", help="Per turn: tokens, cache, cost and duration.")
    ] = False,
) -> None:
    """Show a run: the user's message, what auto-recall injected before it, every model
    call, tool call, effect and result."""
    from heron.trace.read import find_turn, load_run
    from heron.trace.render import render_show, render_stats

    try:
        s, store, prices = _open()
        if stats:
            conv = store.conversation(run)
            every = store.turns(conv.id, maintenance=True) if conv else None
            turns = every if every is not None else [find_turn(store, run)]
            lines = render_stats(store, turns, prices)
        else:
            loaded = load_run(store, run)
            turns, lines = [loaded.turn], render_show(store, loaded, prices, s.timezone)
        for line in lines:
            echo(line)
        _cost_notes(turns, prices)
    except HeronError as e:
        _fail(e)


@trace_app.command("export")
def trace_export(run: RunArg) -> None:
    """Print a run as JSON: every request exactly as sent, replies, tool calls and events."""
    from heron.trace.render import export_run
    from heron.trace.scrub import scrubber_for

    try:
        s, store, _ = _open()
        echo(export_run(store, run, scrubber_for(s.env, s.config.api_keys)))
    except HeronError as e:
        _fail(e)


@trace_app.command("replay")
def trace_replay(
    run: RunArg,
    live_tools: Annotated[
        bool,
        typer.Option(
            "--live-tools",
            help="Run the tools again and report where their results differ: on a copy of the "
            "workspace as it is now, discarded after (your files are not touched).",
        ),
    ] = False,
    in_place: Annotated[
        bool,
        typer.Option(
            "--in-place",
            help="With --live-tools: run the tools in the workspace itself, repeating the "
            "run's writes (write_file, edit_file, bash, run_cell), which are listed first. "
            "For a workspace too big to copy (over 1 GB or 100,000 files).",
        ),
    ] = False,
    recorded_tools: Annotated[
        bool,
        typer.Option(
            "--recorded-tools",
            help="Send the tools as the run described them, not as this Heron does: after an "
            "upgrade, compares the rest of each request.",
        ),
    ] = False,
) -> None:
    """Run the loop again with the recorded replies and check every request it builds.

    Exit status: 0 every request rebuilt and identical; 1 a request or tool result differs;
    3 nothing rebuilt differs, but some requests could not be rebuilt (said, with why)."""
    from heron.agent.replay import replay
    from heron.proactive.wiring import replay_registry

    if in_place and not live_tools:
        raise typer.BadParameter(
            "--in-place only says where --live-tools runs the tools; add --live-tools",
            param_hint="--in-place",
        )
    try:
        s, store, _ = _open()
        # The tools the run had: the engine's and what proactive wiring attached (spawn, ...).
        tools = replay_registry()
        workspace = s.paths.workspace if live_tools else None
        with _tools_folder(store, run, tools, workspace, in_place) as folder:
            report = asyncio.run(
                replay(
                    store,
                    run,
                    registry=tools,
                    live_tools=live_tools,
                    workspace=folder,
                    recorded_tools=recorded_tools,
                )
            )
    except HeronError as e:
        _fail(e)
        return
    echo(report.render())
    raise typer.Exit(report.exit_status)


@contextlib.contextmanager
def _tools_folder(
    store: Store, run: str, tools: ToolRegistry, workspace: Path | None, in_place: bool
) -> Iterator[Path | None]:
    """Where the live tools run (heron/agent/replay_workspace.py); None without live tools."""
    if workspace is None:
        yield None
        return
    from heron.agent.replay_workspace import live_folder
    from heron.trace.read import load_run

    def say(line: str) -> None:
        typer.echo(f"heron: {line}", err=True)

    loaded = functools.partial(load_run, store, run)
    with live_folder(workspace, loaded, tools, in_place=in_place, say=say) as folder:
        yield folder


def usage(
    days: Annotated[int, typer.Option(help="Only the last N days (0: everything).")] = 30,
) -> None:
    """Tokens, cache hit rate and cost, by day and by model."""
    from heron.trace.render import render_usage, usage_turns

    try:
        s, store, prices = _open()
        since = time.time() - days * 86400 if days > 0 else None
        for line in render_usage(store, prices, s.timezone, since):
            echo(line)
        _cost_notes(usage_turns(store, since), prices)
    except HeronError as e:
        _fail(e)
