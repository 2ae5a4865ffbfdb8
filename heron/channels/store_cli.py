"""`heron store copy`: move a home's record from its heron.db into PostgreSQL (docs/scale.md,
"Moving a home"). The copy itself is heron/store/copy.py; here the command: which database,
the progress of long tables, the counts at the end and what to do next."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from heron.channels.common import fail, settings, table
from heron.errors import ConfigError, HeronError

if TYPE_CHECKING:
    from rich.progress import TaskID

    from heron.config import Settings
    from heron.store.copy import Copied, Progress

app = typer.Typer(
    rich_markup_mode="markdown",
    help="The home's database: copy its heron.db into PostgreSQL.",
    no_args_is_help=True,
)
LONG = 5_000  # rows: a table at least this long gets a progress bar


@app.command()
def copy(
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="The PostgreSQL database, postgresql://user@host:port/db (default: "
            "HERON_DATABASE_URL, else [store] url in config.toml).",
        ),
    ] = None,
) -> None:
    """Copy everything this home's heron.db holds into an empty PostgreSQL schema (the home's
    tenant), ids kept, in one transaction. heron.db is left as it was."""
    from heron.store.copy import copy_home
    from heron.store.unused import mark_copied

    home = settings()
    url, source = _target(home, to)
    db = home.paths.db
    try:
        with _Bars() as progress:
            copied = copy_home(db, url, progress)
        mark = mark_copied(db, copied)
    except HeronError as e:
        fail(e)
    _report(copied)
    _next_step(home, to, source, mark.name)


def _target(home: Settings, given: str | None) -> tuple[str, str | None]:
    """The tenant's URL on the database named by `--to`, else by the home's own setting; and
    the setting of the home that names it (None: it names another, or none)."""
    from heron.config import database_url

    try:
        named = _home_url(home)
        if given is None:
            if named is None:
                raise ConfigError(
                    "no PostgreSQL database to copy into",
                    hint="Name it: heron store copy --to postgresql://user@host:5432/db "
                    "(or set HERON_DATABASE_URL).",
                )
            return named
        url = home.tenant_url(database_url(given, "--to"))
    except HeronError as e:
        fail(e)
    return url, named[1] if named is not None and named[0] == url else None


def _home_url(home: Settings) -> tuple[str, str] | None:
    """The tenant URL this home opens, and the setting that names it; None on SQLite."""
    from heron.config import database_url

    env_url = home.env.get("HERON_DATABASE_URL")
    if env_url:
        url = database_url(env_url, "HERON_DATABASE_URL")
        return home.tenant_url(url), "HERON_DATABASE_URL"
    if home.config.store_url:
        return home.tenant_url(home.config.store_url), "[store] url"
    return None


class _Bars:
    """Rich progress bars on stderr, one per long table while it is copied."""

    def __enter__(self) -> Progress:
        from rich.console import Console
        from rich.progress import Progress as Bars

        self._bars = Bars(console=Console(stderr=True), transient=True)
        self._bars.__enter__()
        self._tasks: dict[str, TaskID] = {}
        return self._advance

    def _advance(self, name: str, done: int, total: int) -> None:
        if total < LONG:
            return
        task = self._tasks.get(name)
        if task is None:
            task = self._tasks[name] = self._bars.add_task(f"Copying {name}", total=total)
        self._bars.update(task, completed=done)

    def __exit__(self, *exc: object) -> None:
        self._bars.__exit__(None, None, None)


def _report(copied: Copied) -> None:
    from heron.store.copy import EXCLUDED

    typer.echo(f"Copied into {copied.where}:")
    rows = [(name, f"{n:,}") for name, n in sorted(copied.counts.items())]
    table(("table", "rows"), rows)
    total = sum(copied.counts.values())
    typer.echo(
        f"{total:,} rows in {len(copied.counts)} tables, each count read back from PostgreSQL "
        "and equal to heron.db's."
    )
    typer.echo("Not copied: " + "; ".join(f"{t}: {why}" for t, why in EXCLUDED.items()) + ".")


def _next_step(home: Settings, given: str | None, source: str | None, mark: str) -> None:
    from heron.store.pg_url import redact

    where = home.paths.home
    if source is not None or given is None:
        typer.echo(f"This home names that database already ({source}): its next command uses it.")
    else:
        typer.echo(
            f"Next: point this home at it: export HERON_DATABASE_URL='{redact(given)}' (as "
            f"you gave it, with its password if it has one), or url under [store] in "
            f"{home.paths.config}. Restart heron serve, if you use one, with it set."
        )
    typer.echo(
        f"{home.paths.db} is left as it was: unset the URL to go back to it (what is done on "
        "PostgreSQL from now on is not in it). Memory, the workspace, attachments and "
        f"config.toml stay in {where}, used as before. The notice that heron.db is not used "
        f"stays quiet for this copy ({where / mark} records it)."
    )
