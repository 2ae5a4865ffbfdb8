"""What every command of the `heron` CLI shares: how a Heron error ends it, and how it loads the
settings. Here, below cli.py, so that the channel modules that define commands need not import
the module that mounts them."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import typer

from heron.errors import ConfigError, HeronError

if TYPE_CHECKING:
    from heron.config import Settings


def fail(error: HeronError) -> NoReturn:
    """Print the error (its hint included) and exit: 2 for bad configuration, 1 otherwise."""
    typer.echo(f"heron: {error}", err=True)
    raise typer.Exit(2 if isinstance(error, ConfigError) else 1)


def settings() -> Settings:
    """The settings of HERON_HOME, or the command ends with the error that stopped them."""
    from heron.config import Settings

    try:
        return Settings.load()
    except HeronError as e:
        fail(e)
