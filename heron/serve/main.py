"""`heron serve`'s process: the lock, the engine, the runtime, uvicorn and the control socket
in one asyncio loop, and a clean shutdown on SIGINT or SIGTERM.

Shutdown order matters: running turns are stopped first (as by /stop: finished tool work
and the record kept) and their last events reach every client; then the control socket and
the web server close. uvicorn's own signal handling is replaced by ours, because it re-raises
the signal after serving, which would end the process with the signal instead of 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import uvicorn

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import MessageBus
from heron.channels.web_login import NO_BROWSER, open_in_browser
from heron.config import Settings
from heron.providers import warm
from heron.providers.base import Provider
from heron.serve.app import create_app
from heron.serve.auth import CODE_SECONDS, Auth, allowed_hosts, is_loopback, login_url
from heron.serve.control import start_control
from heron.serve.lock import SOCKET_NAME, ServeInfo, ServeLock
from heron.serve.ports import bind_error
from heron.serve.runtime import Runtime, Service
from heron.tools.approval import start_notice
from heron.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from fastapi import FastAPI

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The terminal or SSH session the serve was started in closed: the same clean shutdown,
# unless SIGHUP is ignored (`nohup heron serve`), where it must go on being ignored.
HANGUP = signal.SIGHUP


def shutdown_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop the serve cleanly: SIGINT, SIGTERM and a SIGHUP not ignored."""
    ignored = signal.getsignal(HANGUP) is signal.SIG_IGN
    return SIGNALS if ignored else (*SIGNALS, HANGUP)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # serve() installs the handlers instead (see the module docstring)


def default_services() -> list[Service]:
    """What runs beside the loop in every serve: the scheduler and the heartbeat
    (heron/proactive, docs/proactive.md), and the sentence vectors a long history lacks
    (heron/memory/backfill.py)."""
    from heron.proactive.background import run_proactive

    return [run_proactive, _backfill_vectors]


async def _backfill_vectors(loop: AgentLoop) -> None:
    """The sentence vectors of messages a search leaves to be filled in (a long history the
    embeddings extra was installed on, a busy hour): embedded in the background, looked for
    every minute."""
    from heron.memory.backfill import CHECK_S, backfill_vectors

    recall = loop.engine.recall
    if recall is not None and recall.embedder is not None:  # the extra is installed and on
        await backfill_vectors(loop.engine.settings.database, recall.embedder, CHECK_S)


async def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    model: str | None = None,
    provider: Provider | None = None,
    registry: ToolRegistry | None = None,
    services: Sequence[Service] | None = None,
    auth: Auth | None = None,
    open_browser: bool = False,
    out: TextIO | None = None,
    on_ready: Callable[[ServeInfo, str], None] | None = None,
    until: asyncio.Event | None = None,
    signals: bool = True,
    workers: int = 0,
) -> None:
    """Run until SIGINT or SIGTERM, or until `until` is set (tests: with `signals` False the
    process's handlers are left alone, and `provider`/`registry`/`auth` replace the configured
    ones); `on_ready` is told where it listens and its start-up login address (printed only
    when `out` is a terminal: `is_terminal`). With
    `open_browser`, that address is opened in the person's browser. With `workers`, turns run
    in that many `heron worker` processes on PostgreSQL (docs/scale.md), and this process is
    their face."""
    out = sys.stdout if out is None else out  # read now: a caller may have swapped it
    home = settings.paths.ensure().home
    with ServeLock(home) as lock, contextlib.closing(_listen(host, port, home)) as sock:
        async with (
            Engine.open(settings, model=model, provider=provider, registry=registry) as engine,
            contextlib.AsyncExitStack() as stack,
        ):
            # The provider's SDK loaded on a worker thread while the rest starts, and awaited
            # before the serve says it is ready: the first message would wait for it (about a
            # second on a busy machine). Turns run in the workers when there are some.
            warming = asyncio.create_task(warm(engine.provider)) if workers == 0 else None
            chosen = list(default_services() if services is None else services)
            make_loop: Callable[[Engine, MessageBus], AgentLoop] = AgentLoop
            staff = None
            if workers > 0:
                from heron.scale.front import front

                opened = await stack.enter_async_context(front(settings, workers, model))
                make_loop, more, staff = opened
                chosen += more
            # Subagents, ask_user and goals in this process's loop; not with workers yet.
            runtime = Runtime(engine, chosen, make_loop=make_loop, proactive=workers == 0)
            if staff is not None:  # every welcome says how many of its workers are alive
                about, counts = runtime.hub.about, staff.counts
                about["workers"] = counts()
                staff.listeners.append(lambda: about.update(workers=counts()))
            auth = auth or Auth.load(home)
            bound_host, bound_port = sock.getsockname()[:2]
            shown, note = shown_url(bound_host, bound_port)
            note = "\n".join(filter(None, [note, plain_http_notice(bound_host)])) or None
            await runtime.start()
            control = await start_control(
                runtime, home / SOCKET_NAME, login=lambda: login_url(shown, auth.new_code())
            )
            app = create_app(runtime, auth, allowed_hosts(bound_host, bound_port))
            server = _Server(_config(app, host, port))
            stopper = _Stopper(runtime, server)
            if signals:
                stopper.install()
            watch = asyncio.create_task(stopper.after(until)) if until is not None else None
            try:
                if warming is not None:
                    await warming
                login = login_url(shown, auth.new_code(first=True))
                url = _url(bound_host, bound_port)
                printed = login if is_terminal(out) else None
                info = _announce(lock, url, shown, note, printed, engine, out, open_browser)
                if open_browser:  # a console browser would hold the loop: on a thread
                    args = (login, out, printed is not None)
                    threading.Thread(target=_open, args=args, daemon=True).start()
                if on_ready is not None:
                    on_ready(info, login)
                await server.serve(sockets=[sock])
            finally:
                stopper.remove()
                if watch is not None:
                    watch.cancel()
                control.close()
                await runtime.close()
                with contextlib.suppress(Exception):
                    await control.wait_closed()


def _open(login: str, out: TextIO, printed: bool) -> None:
    """Open the login address in the person's browser, and say so when none could be opened
    (a machine without a display): the printed address is then the way in, or, when none was
    printed, `heron web`."""
    if not open_in_browser(login):
        out.write(f"{NO_BROWSER if printed else NO_BROWSER_NOT_PRINTED}\n")
        out.flush()


def _config(app: FastAPI, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="on", ws="websockets-sansio"
    )


def _listen(host: str, port: int, home: Path) -> socket.socket:
    """Bind and listen before uvicorn starts: the URL is known (port 0 picks a free one) and
    connections wait in the backlog until it serves them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise bind_error(host, port, e, home) from e
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


# Said instead of the login address when the serve's output is not a terminal.
NOT_PRINTED = (
    "Log in: run `heron web` for a login address (none is printed here: this output is not a "
    "terminal, and a file or pipe can be read by the agent's commands)"
)
# The same with `--open`: the browser is asked to open the address, which is still not printed.
OPENED_NOT_PRINTED = (
    "Log in: your browser is asked to open the login address (none is printed here: this "
    "output is not a terminal); for another browser, run `heron web`"
)
NO_BROWSER_NOT_PRINTED = (
    "heron: found no browser to open here; run `heron web` for a login address to open in yours."
)


def is_terminal(out: TextIO) -> bool:
    """Whether `out` is a terminal. Only there is the login address printed: a file it is
    redirected to (`nohup`, `> serve.log`) lies outside HERON_HOME, where a sandboxed command
    with `network = "loopback"` could read the code and log in as the person."""
    try:
        return out.isatty()
    except (ValueError, OSError):  # closed, or a stream that cannot tell
        return False


def _announce(
    lock: ServeLock,
    url: str,
    shown: str,
    note: str | None,
    login: str | None,
    engine: Engine,
    out: TextIO,
    opening: bool = False,
) -> ServeInfo:
    choice = engine.choice
    info = lock.publish(url, f"{choice.provider}/{choice.model}")
    out.write(f"heron serve: {shown}  ({choice.provider}/{choice.model}, pid {os.getpid()})\n")
    notice = start_notice(engine.registry, engine.sandbox)
    if notice:
        out.write(f"heron: {notice}\n")
    minutes = CODE_SECONDS // 60
    if login is None:
        out.write(f"{OPENED_NOT_PRINTED if opening else NOT_PRINTED}\n")
    else:
        out.write(
            f"Log in: {login}\n(the code works once, for {minutes} minutes, and no longer once "
            "`heron web` gives a new one for another browser)\n"
        )
    if note:
        out.write(f"{note}\n")
    out.write("Ctrl-C stops it; heron run and heron chat on this home now go through it.\n")
    out.flush()
    return info


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


WILDCARDS = ("0.0.0.0", "::")  # bound to every interface: no address a browser can open


def shown_url(
    host: str, port: int, find: Callable[[str], str | None] | None = None
) -> tuple[str, str | None]:
    """The address to print, and a note when it needs one. A wildcard bind is printed as this
    machine's address on its outward interface (`find`, by default `outward_address`); when
    there is none to find, as it is, with a note to put the machine's address in its place."""
    if host not in WILDCARDS:
        return _url(host, port), None
    found = (find or outward_address)(host)
    listening = f"Listening on every interface ({host}); "
    if found:
        return _url(found, port), listening + "from another machine, use an address of this one."
    note = f"replace {host} in the address with this machine's name or address."
    return _url(host, port), listening + note


PLAIN_HTTP = (
    "heron: plain HTTP: the login code and the session cookie cross the network unencrypted, "
    "readable on the way; put a TLS reverse proxy in front, or use an SSH tunnel to a serve on "
    "127.0.0.1 (docs/serve.md#off-this-machine-tls)."
)


def plain_http_notice(host: str) -> str | None:
    """The warning a bind other than loopback prints: the serve speaks no TLS itself."""
    return None if is_loopback(host) else PLAIN_HTTP


def outward_address(host: str) -> str | None:
    """The address this machine would send from (a UDP socket's connect picks the route and
    sends nothing), or None without a route off the machine."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    target = "2001:db8::1" if family == socket.AF_INET6 else "192.0.2.1"  # documentation nets
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            found = str(probe.getsockname()[0])
    except OSError:
        return None
    return None if found in WILDCARDS or found.startswith("127.") or found == "::1" else found


class _Stopper:
    """SIGINT/SIGTERM/SIGHUP (or `until`): stop the turns (their last events still go out), then
    the server. A second signal forces the exit."""

    def __init__(self, runtime: Runtime, server: _Server) -> None:
        self.runtime, self.server = runtime, server
        self.task: asyncio.Task[None] | None = None
        self.installed: tuple[signal.Signals, ...] = ()

    def stop(self) -> None:
        if self.task is not None:
            self.server.force_exit = self.server.should_exit = True
            return
        self.task = asyncio.create_task(self._shutdown())

    async def _shutdown(self) -> None:
        await self.runtime.close()
        self.server.should_exit = True

    async def after(self, event: asyncio.Event) -> None:
        await event.wait()
        self.stop()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        self.installed = shutdown_signals()
        for sig in self.installed:
            loop.add_signal_handler(sig, self.stop)

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.installed:
            loop.remove_signal_handler(sig)
        self.installed = ()
