"""What the browser tests and bench/web.py share: a model the test steers chunk by chunk, a real
uvicorn on 127.0.0.1 serving the web UI in a thread, and headless Chromium (Debian's, through
Playwright: `playwright install` cannot download browsers here).

`SteeredModel` streams exactly what the test feeds it (`feed`), waiting in between, so a test
can look at the page mid-stream, reload it, or stop the turn while a tool runs.

Every bind needs a login: `serve` opens the login address the serve printed once, and
`Served.context`/`Served.page` give each browser context that session's cookie (a code works
once; the cookie is what a browser keeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve_helpers import TerminalOut

from heron.messages import Reply, Text, Thinking, ToolCall, Usage
from heron.request import ChatRequest, StreamEvent

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--disable-component-update",
]


@dataclass
class SteeredModel:
    """A provider whose every reply is fed by the test: ("text", s), ("thinking", s),
    ("call", ToolCall), then ("end", None); ("raise", error) fails the call there. `auto`
    answers requests nobody fed at once."""

    name: str = "scripted"
    model: str = "scripted"
    auto: str | None = None
    steps: queue.Queue[tuple[str, Any]] = field(default_factory=queue.Queue)
    requests: list[ChatRequest] = field(default_factory=list)

    def feed(self, *steps: tuple[str, Any]) -> None:
        for step in steps:
            self.steps.put(step)

    def reply(self, text: str) -> None:
        self.feed(("text", text), ("end", None))

    async def chat(self, request: ChatRequest, on_event: Any = None) -> Reply:
        self.requests.append(request)
        parts: list[Any] = []
        while True:
            try:
                kind, value = await asyncio.to_thread(self.steps.get, True, 0.05)
            except queue.Empty:
                if self.auto is not None and not parts:
                    return Reply([Text(self.auto)], "done", Usage(10, 2))
                continue
            if kind == "raise":  # the stream fails here (a cut): the runner retries the call
                raise value
            if kind == "end":
                stop = "tool" if any(isinstance(p, ToolCall) for p in parts) else "done"
                return Reply(parts, stop, Usage(10, 2))
            if kind == "call":
                parts.append(value)
                continue
            part = Text(value) if kind == "text" else Thinking(value)
            parts.append(part)
            if on_event is not None:
                on_event(StreamEvent(kind, value))

    def payload(self, request: ChatRequest) -> dict[str, Any]:
        return {"model": self.model, "messages": len(request.messages)}

    async def aclose(self) -> None:
        return None


@dataclass
class Served:
    """A running `heron serve`: where it listens, the login address it printed, and the
    session cookie opening that address set."""

    url: str
    login: str
    token: str
    home: Path
    loop: asyncio.AbstractEventLoop

    @property
    def control(self) -> Path:
        from heron.serve.lock import SOCKET_NAME

        return self.home / SOCKET_NAME

    @property
    def cookie(self) -> dict[str, str]:
        from heron.serve.auth import COOKIE

        return {"Cookie": f"{COOKIE}={self.token}"}

    def context(self, browser: Any, **options: Any) -> Any:
        """A browser context logged in to this serve (its own cookies, storage and pages).
        Its pages prefer reduced motion (unless a test says otherwise): the spinner of a
        running turn stands still (style.css) instead of redrawing the page eight times a
        second, 0.04 s of Chromium's CPU a second per page; nothing a test asserts moves.
        bench/web.py, which measures what a person's tab costs, opens its own contexts."""
        options.setdefault("reduced_motion", "reduce")
        return logged_in(browser, self.url, self.token, **options)

    def page(self, browser: Any, path: str = "/", **options: Any) -> Any:
        """A page of a new logged-in context, opened at `path` (`pg.context.close()` ends
        both)."""
        pg = self.context(browser, **options).new_page()
        pg.goto(self.url + path)
        return pg


def logged_in(browser: Any, url: str, token: str, **options: Any) -> Any:
    """A new browser context holding the session cookie `token` for the serve at `url`, as
    the browser that opened the login address holds it."""
    from heron.serve.auth import COOKIE

    context = browser.new_context(**options)
    cookie = {"name": COOKIE, "value": token, "url": url}
    context.add_cookies([{**cookie, "httpOnly": True, "sameSite": "Strict"}])
    return context


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def log_in(login: str) -> str:
    """Open a login address as a browser would; the session token its cookie carries."""
    from heron.serve.auth import COOKIE

    try:
        urllib.request.build_opener(_NoRedirect).open(login, timeout=30)
    except urllib.error.HTTPError as e:  # the 303 to "/", not followed
        assert e.code == 303, e.read()
        found = e.headers.get_all("set-cookie") or []
    else:
        raise AssertionError("the login address did not redirect")
    for header in found:
        name, _, rest = header.partition("=")
        if name == COOKIE:
            return rest.split(";")[0]
    raise AssertionError(f"no session cookie in {found}")


@contextlib.contextmanager
def serve(provider: Any, registry: Any = None, port: int = 0, **options: Any) -> Iterator[Served]:
    """The real `heron serve` (heron/serve/main.py: uvicorn, /ws, the control socket) on
    127.0.0.1 in a thread with its own event loop, until the block ends (`port` 0: any free
    one; a port of a serve that ended restarts it there)."""
    from heron.config import Settings
    from heron.serve.main import serve as run_serve

    ready: queue.Queue[Any] = queue.Queue()
    loop = asyncio.new_event_loop()
    stop: list[asyncio.Event] = []
    out = TerminalOut()  # a terminal: where the serve prints its login address

    async def main() -> None:
        stop.append(asyncio.Event())
        await run_serve(
            Settings.load(),
            port=port,
            provider=provider,
            registry=registry,
            out=out,
            on_ready=lambda info, login: ready.put((info, login)),
            until=stop[0],
            signals=False,
            **options,
        )

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as e:  # told to the waiting test instead of lost in the thread
            ready.put(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    got = ready.get(timeout=60)  # a bound against a hang, never a timing assertion
    if isinstance(got, BaseException):
        raise got
    info, login = got
    try:
        assert f"Log in: {login}\n" in out.getvalue()  # the address it printed
        yield Served(info.url, login, log_in(login), Settings.load().paths.home, loop)
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(30)
        loop.close()


def control_send(
    served: Served, text: str, key: str = "personal", channel: str = "cli"
) -> list[dict[str, Any]]:
    """What a terminal client does: hello and send on the control socket; returns the events
    it read until its turn ended (`channel` "terminal" names it as `heron chat` does)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(served.control))
        hello = {"type": "hello", "conversation": key, "last_seq": None, "channel": channel}
        sock.sendall((json.dumps(hello) + "\n").encode())
        sock.sendall((json.dumps({"type": "send", "text": text}) + "\n").encode())
        events: list[dict[str, Any]] = []
        buf = b""
        while not any(e.get("type") == "turn_end" for e in events):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            events += [json.loads(line) for line in lines if line.strip()]
        return events


def control_login(served: Served) -> str:
    """What `heron web` does: a fresh one-time login address from the serve's control socket."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(served.control))
        sock.sendall(b'{"type": "login"}\n')
        answer = json.loads(sock.makefile("rb").readline())
    assert answer["type"] == "login", answer
    return str(answer["url"])


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()
