"""`heron web`: log a browser in to the web UI of the running `heron serve`.

The serve hands out a fresh one-time login address over its control socket (HERON_HOME, mode
0600), so a browser is let in by someone who can reach the home, never by whoever can reach
the port. The address is printed, and opened with `--open`.
"""

from __future__ import annotations

import typer

from heron.channels.remote import login_offer
from heron.config import Settings
from heron.errors import ConfigError

# Said by `heron web --open` and `heron serve --open` when no browser could be opened.
NO_BROWSER = "heron: found no browser to open here; open the address in yours."


def web_login(settings: Settings, open_browser: bool) -> None:
    """Print a fresh login address of this home's serve (and open it); refused under a tool
    command, and when no serve runs."""
    from heron.tools.person import ensure_person

    ensure_person("logging a browser in to the web UI")
    home = settings.paths.home
    offered = login_offer(home)
    if offered is None:
        raise ConfigError(
            f"no heron serve runs on {home}",
            hint="Start one with `heron serve` (it prints a login address too; "
            "`heron serve --open` opens it in your browser).",
        )
    url, minutes = offered
    typer.echo(url)
    typer.echo(
        f"Open it once to log this browser in (it works once, for {minutes} minutes).", err=True
    )
    if open_browser and not open_in_browser(url):
        typer.echo(NO_BROWSER, err=True)


def open_in_browser(url: str) -> bool:
    """Open `url` in the person's browser (the webbrowser module picks it); False when there
    is none to open (a machine without a display), which the printed address makes up for."""
    import webbrowser

    try:
        return webbrowser.open(url)
    except webbrowser.Error:
        return False
