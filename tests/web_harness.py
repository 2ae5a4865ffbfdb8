"""What the browser tests and bench/web.py share: a model the test steers chunk by chunk, a real
uvicorn on 127.0.0.1 serving the web UI in a thread, and headless Chromium (Debian's, through
Playwright: `playwright install` cannot download browsers here).

`SteeredModel` streams exactly what the test feeds it (`feed`), waiting in between, so a test
can look at the page mid-stream, reload it, or stop the turn while a tool runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from heron.messages import Reply, Text, Thinking, ToolCall, Usage
from heron.providers.base import ChatRequest, StreamEvent

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
    ("call", ToolCall), then ("end", None). `auto` answers requests nobody fed at once."""

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    url: str
    app: Any
    server: Any
    thread: threading.Thread


@contextlib.contextmanager
def serve(app: Any, host: str = "127.0.0.1") -> Iterator[Served]:
    """Run `app` under a real uvicorn in a thread until the block ends."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", ws="websockets")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:  # a bound against a hang, never a timing assertion
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield Served(f"http://127.0.0.1:{port}", app, server, thread)
    finally:
        server.should_exit = True
        thread.join(20)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()
