"""What every command of the `heron` CLI shares: how a Heron error ends it, and how it loads the
settings. Here, below cli.py, so that the channel modules that define commands need not import
the module that mounts them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

import typer

from heron.channels.visible import for_stream
from heron.errors import ConfigError, HeronError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from heron.config import Settings


def echo(text: str = "", *, err: bool = False, nl: bool = True) -> None:
    """`typer.echo` for what may hold text the model, a tool or a page wrote (a reply, a job's
    prompt, a title, an error a server sent): on a terminal its control characters are shown,
    never obeyed; a pipe or a file gets it exact (heron/channels/visible.py)."""
    typer.echo(for_stream(text, sys.stderr if err else sys.stdout), err=err, nl=nl)


def fail(error: HeronError) -> NoReturn:
    """Print the error (its hint included) and exit: 2 for bad configuration, 1 otherwise."""
    echo(f"heron: {error}", err=True)
    raise typer.Exit(2 if isinstance(error, ConfigError) else 1)


def conversation_key(value: str | None) -> str | None:
    """A conversation key given on the command line (a typer callback): a blank one, or one
    with control characters, is refused as a bad option is (exit 2; `key_problem`)."""
    from heron.messages import key_problem

    problem = None if value is None else key_problem(value)
    if problem is not None:
        raise typer.BadParameter(problem)
    return value


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """Print rows under a header line, columns padded to their widest cell; the last column is
    left ragged (it holds free text such as a title or a prompt). Widths are terminal cells, so
    a key with an emoji or CJK characters (two cells each) does not push its row askew."""
    from rich.cells import cell_len

    widths = [max(cell_len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [str(c) + " " * (w - cell_len(str(c))) for c, w in zip(row, widths, strict=False)]
        echo("  ".join([*cells, str(row[-1])]).rstrip())


def settings() -> Settings:
    """The settings of HERON_HOME, or the command ends with the error that stopped them."""
    from heron.config import Settings

    try:
        return Settings.load()
    except HeronError as e:
        fail(e)


def settings_as_they_load() -> tuple[Settings, ConfigError | None]:
    """The settings of HERON_HOME, the defaults in place of a config.toml that does not load
    (with its error, for the command to say as it sees fit), or the command ends with the
    error that stopped them (`Settings.load_reading`)."""
    from heron.config import Settings

    try:
        return Settings.load_reading()
    except HeronError as e:
        fail(e)


def reading_settings() -> Settings:
    """The settings of a command that only names Heron's files or reads the record (`config
    path`, `conversations list/show/search/export`, `trace ls/show/export`, `usage`): a broken
    config.toml is said once on stderr, where and what, and the command goes on with the
    default settings, so the person can find the file and rescue their data. Every command
    that would run a turn still refuses it."""
    loaded, broken = settings_as_they_load()
    if broken is not None:
        echo(f"heron: {broken}", err=True)
        echo(
            "heron: this command goes on with the default settings; commands that run a turn"
            " refuse until the file loads.",
            err=True,
        )
    return loaded
