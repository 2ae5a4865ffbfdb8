"""A `heron serve` in the test's own event loop (real uvicorn on 127.0.0.1, port 0, the
control socket in the test's HERON_HOME), and small clients for /ws and the control socket.

Every bind needs a login: `running_serve` logs in once through the address the serve printed,
as a person would, and its `ws_client` and `http` carry that session's cookie. Its output is a
`TerminalOut` (the serve prints the address on a terminal only) unless asked otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from heron.config import Settings
from heron.providers.base import Provider
from heron.serve.auth import COOKIE
from heron.serve.lock import ServeInfo
from heron.tools.registry import ToolRegistry

WAIT = 30.0  # a bound on every wait, so a broken test fails instead of hanging


class TerminalOut(StringIO):
    """A serve's output that says it is a terminal: where the serve prints its login address."""

    def isatty(self) -> bool:
        return True


@dataclass
class Running:
    info: ServeInfo
    login: str  # its start-up login address (printed on a terminal, spent by the helper)
    out: StringIO
    stop: asyncio.Event
    task: asyncio.Task[None]
    token: str = ""  # the session cookie that login set

    @property
    def url(self) -> str:
        return self.info.url

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/ws"

    @property
    def cookie(self) -> dict[str, str]:
        return {"Cookie": f"{COOKIE}={self.token}"}

    def http(self, **options: Any) -> httpx.AsyncClient:
        """A client of the serve's HTTP routes, logged in (`cookies={}`: not)."""
        options.setdefault("cookies", {COOKIE: self.token})
        return httpx.AsyncClient(base_url=self.url, **options)


async def log_in(login: str) -> str:
    """Open a login address as a browser would; the session token its cookie carries."""
    async with httpx.AsyncClient() as http:
        response = await http.get(login)
    assert response.status_code == 303, response.text
    return response.cookies[COOKIE]


@contextlib.asynccontextmanager
async def running_serve(
    provider: Provider,
    registry: ToolRegistry | None = None,
    *,
    terminal: bool = True,
    **options: Any,
) -> AsyncIterator[Running]:
    """`terminal` False: its output is a plain buffer, as a file would be; the serve prints no
    login address there, and the helper logs in with a fresh one (as `heron web` asks)."""
    from heron.serve.main import serve

    ready: asyncio.Future[tuple[ServeInfo, str]] = asyncio.get_running_loop().create_future()
    stop, out = asyncio.Event(), TerminalOut() if terminal else StringIO()
    task = asyncio.create_task(
        serve(
            Settings.load(),
            port=0,
            provider=provider,
            registry=registry,
            out=out,
            on_ready=lambda info, login: ready.set_result((info, login)),
            until=stop,
            signals=False,
            **options,
        )
    )
    done, _ = await asyncio.wait({task, ready}, timeout=WAIT, return_when="FIRST_COMPLETED")
    if task in done:
        await task  # it failed to start: raise why
    info, login = ready.result()
    running = Running(info, login, out, stop, task)
    try:
        if terminal:
            assert f"Log in: {login}\n" in out.getvalue()  # the address it printed
        else:
            login = await control_login(info.socket)  # `login` stays the start-up one
        running.token = await log_in(login)
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)


@contextlib.asynccontextmanager
async def ws_client(running: Running, **options: Any) -> AsyncIterator[ClientConnection]:
    """A /ws client of the served origin, logged in (`additional_headers={}`: not)."""
    options.setdefault("origin", running.url)
    options.setdefault("additional_headers", running.cookie)
    async with connect(running.ws_url, **options) as ws:
        yield ws


async def ws_hello(ws: ClientConnection, key: str = "personal", last_seq: int | None = 0):
    await ws.send(json.dumps({"type": "hello", "conversation": key, "last_seq": last_seq}))
    return await ws_next(ws)


async def ws_next(ws: ClientConnection, hub: bool = False) -> dict[str, Any]:
    """The next event of the attached conversation; with `hub`, the hub's own `status`
    events too (where turns run: outside any conversation, no seq), which are else skipped."""
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
        if hub or not (event["type"] == "status" and event.get("state") == "running"):
            return event


def matches(event: dict[str, Any], kind: str) -> bool:
    """`kind` is an event type, or "idle": the status that follows a turn's end."""
    if kind == "idle":
        return event["type"] == "status" and event["state"] == "idle"
    return event["type"] == kind


async def ws_until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    """Every event up to and including the first of `kind` (see `matches`)."""
    seen = []
    while True:
        event = await ws_next(ws)
        seen.append(event)
        if matches(event, kind):
            return seen


class LineClient:
    """The control socket, spoken by hand (the real client is heron/channels/remote.py)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, path: str | Path) -> LineClient:
        reader, writer = await asyncio.open_unix_connection(str(path))
        return cls(reader, writer)

    async def send(self, message: dict[str, Any]) -> None:
        self.writer.write(json.dumps(message).encode() + b"\n")
        await self.writer.drain()

    async def next(self) -> dict[str, Any]:
        line = await asyncio.wait_for(self.reader.readline(), WAIT)
        assert line, "the serve closed the control socket"
        return json.loads(line)

    async def until(self, kind: str) -> list[dict[str, Any]]:
        seen = []
        while True:
            event = await self.next()
            seen.append(event)
            if matches(event, kind):
                return seen

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


async def control_login(socket_path: str | Path) -> str:
    """What `heron web` asks the serve for: a new login address."""
    client = await LineClient.open(socket_path)
    await client.send({"type": "login"})
    answer = await client.next()
    await client.close()
    assert answer["type"] == "login", answer
    return str(answer["url"])


class ServeProcess:
    """A real `heron serve --port PORT` subprocess on `home` (any free port for 0), ready once
    it printed its URL."""

    def __init__(self, home: Path, env: dict[str, str], port: int = 0) -> None:
        self.home, self.env, self.port = home, env, port
        self.proc: subprocess.Popen[str] | None = None
        self.banner = ""
        self.login = ""  # a login address, asked for as `heron web` does (none is printed)
        self.said: list[str] = []  # the lines of its start read so far, the banner first
        self.logged: list[str] = []  # its log (stderr), read as it comes

    def __enter__(self) -> ServeProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "heron", "serve", "--port", str(self.port)],
            env=clean_env(self.home, self.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.banner = self.proc.stdout.readline()  # blocks until it listens (or dies)
        assert self.banner.startswith("heron serve: "), self.proc.stderr.read()
        self.said.append(self.banner)
        while not self.said[-1].startswith("Log in: "):  # its start's lines come out together
            line = self.proc.stdout.readline()
            assert line, "heron serve did not say how to log in"
            self.said.append(line)
        # Its output is a pipe, not a terminal: the line says to run `heron web`, which this does.
        assert "code=" not in self.said[-1], self.said[-1]
        from heron.channels.remote import serve_login

        self.login = serve_login(self.home) or ""
        assert self.login, "heron serve gave no login address over its control socket"
        # The serve logs each turn to stderr: read, the pipe never fills and stalls the serve.
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with contextlib.suppress(ValueError, OSError):  # closed by __exit__ mid-read
            for line in self.proc.stderr:
                self.logged.append(line)

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        if self.proc.stderr:
            self.proc.stderr.close()


def clean_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
    }
    env.update({"HERON_HOME": str(home), **extra})
    return env


@contextlib.contextmanager
def maybe_serve(mode: str, home: Path, env: dict[str, str]):
    """For tests of the CLI in both modes: a serve on the home in "serve" mode, none in
    "inprocess" mode."""
    if mode == "serve":
        with ServeProcess(home, env) as serve:
            yield serve
    else:
        yield None
