"""What the browser tests and bench/web.py share: a model the test steers chunk by chunk, a real
uvicorn on 127.0.0.1 serving the web UI in a thread, and headless Chromium (Debian's, through
Playwright: `playwright install` cannot download browsers here).

`SteeredModel` streams exactly what the test feeds it (`feed`), waiting in between, so a test
can look at the page mid-stream, reload it, or stop the turn while a tool runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import queue
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """A running `heron serve`: where it listens, its login (auth off loopback)."""

    url: str
    auth: Any
    home: Path
    loop: asyncio.AbstractEventLoop

    @property
    def control(self) -> Path:
        from heron.serve.lock import SOCKET_NAME

        return self.home / SOCKET_NAME


@contextlib.contextmanager
def serve(provider: Any, registry: Any = None, **options: Any) -> Iterator[Served]:
    """The real `heron serve` (heron/serve/main.py: uvicorn, /ws, the control socket) on
    127.0.0.1 in a thread with its own event loop, until the block ends."""
    from heron.config import Settings
    from heron.serve.main import serve as run_serve

    ready: queue.Queue[Any] = queue.Queue()
    loop = asyncio.new_event_loop()
    stop: list[asyncio.Event] = []

    async def main() -> None:
        stop.append(asyncio.Event())
        await run_serve(
            Settings.load(),
            port=0,
            provider=provider,
            registry=registry,
            out=io.StringIO(),
            on_ready=lambda info, auth: ready.put((info, auth)),
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
    info, auth = got
    try:
        yield Served(info.url, auth, Settings.load().paths.home, loop)
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(30)
        loop.close()


def control_send(served: Served, text: str, key: str = "personal") -> list[dict[str, Any]]:
    """What a terminal client does: hello and send on the control socket; returns the events
    it read until its turn ended."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(served.control))
        hello = {"type": "hello", "conversation": key, "last_seq": None, "channel": "cli"}
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


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()
