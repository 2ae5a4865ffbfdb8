"""A small stand-in for `heron serve`'s app (heron/serve/app.py) that speaks the same protocol
(docs/web.md): the browser tests run against it until the serve branch's `create_app` is
merged, then against that. One AgentLoop in the app's lifespan, a numbered journal per
conversation, /ws, the static UI and the REST routes."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.staticfiles import StaticFiles

from heron.agent.engine import Engine
from heron.channels.inprocess import connect
from heron.config import Settings
from heron.serve import api

STATIC = Path(__file__).resolve().parent.parent / "heron" / "web" / "static"


class Journal:
    def __init__(self, key: str) -> None:
        self.key, self.seq, self.busy = key, 0, False
        self.events: deque[dict[str, Any]] = deque(maxlen=2000)
        self.clients: set[asyncio.Queue[dict[str, Any]]] = set()

    def append(self, event: dict[str, Any]) -> None:
        self.seq += 1
        event.update(seq=self.seq, conversation=self.key)
        self.events.append(event)
        for q in self.clients:
            q.put_nowait(event)


def _events(item: Any) -> list[dict[str, Any]]:
    if not hasattr(item, "call"):  # an OutboundMessage
        return [{"type": "message", "kind": item.kind, "text": item.text}]
    k = item.kind
    if k == "turn_start":
        return [{"type": "turn_start", "turn_id": None, "text": item.text, "channel": "web"}]
    if k in ("delta", "progress", "reasoning"):
        return [{"type": "reasoning" if k == "reasoning" else "delta", "text": item.text}]
    if k == "tool_start":
        return [
            {
                "type": "tool_start",
                "call_id": item.call.id,
                "name": item.call.name,
                "args": item.call.args,
            }
        ]
    if k == "tool_end":
        return [
            {
                "type": "tool_end",
                "call_id": item.call.id,
                "name": item.call.name,
                "result": item.result.content,
                "is_error": item.result.is_error,
            }
        ]
    if k in ("mail", "queued", "retry", "restart"):
        return [{"type": "status", "state": k}]
    if k == "turn_end":
        return [
            {
                "type": "turn_end",
                "turn_id": None,
                "outcome": item.end.outcome,
                "interrupted": item.end.outcome == "stale",
            }
        ]
    return []


def build_app(provider: Any) -> FastAPI:
    journals: dict[str, Journal] = {}

    def journal(key: str) -> Journal:
        return journals.setdefault(key, Journal(key))

    async def deliver(item: Any) -> None:
        j = journal(item.key)
        for event in _events(item):
            if event["type"] == "turn_start":
                j.busy = True
            if event["type"] == "turn_end":
                j.busy = False
            j.append(event)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings = Settings.load()
        api.install(app, settings, busy=lambda key: journal(key).busy)
        async with (
            Engine.open(settings, provider=provider) as engine,
            connect(engine, "web", "tabs", deliver) as agent,
        ):
            app.state.agent = agent
            yield

    app = FastAPI(lifespan=lifespan)
    app.include_router(api.router)

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        current: list[Journal] = []

        async def pump() -> None:
            while True:
                await websocket.send_json(await q.get())

        task = asyncio.create_task(pump())
        try:
            while True:
                msg = await websocket.receive_json()
                kind = msg.get("type")
                if kind == "hello":
                    for j in current:
                        j.clients.discard(q)
                    j = journal(str(msg.get("conversation") or "personal"))
                    current[:] = [j]
                    last = int(msg.get("last_seq") or 0)
                    q.put_nowait(
                        {
                            "type": "welcome",
                            "conversation": j.key,
                            "seq": j.seq,
                            "busy": j.busy,
                            "title": None,
                        }
                    )
                    for e in j.events:
                        if e["seq"] > last:
                            q.put_nowait(e)
                    j.clients.add(q)
                elif kind in ("send", "command", "stop") and current:
                    text = "/stop" if kind == "stop" else str(msg.get("text") or "")
                    await app.state.agent.send(text, current[0].key)
        except WebSocketDisconnect:
            pass
        finally:
            for j in current:
                j.clients.discard(q)
            task.cancel()

    app.mount("/", StaticFiles(directory=STATIC, html=True), name="static")
    return app
