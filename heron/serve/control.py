"""The control socket: `$HERON_HOME/serve.sock`, a Unix socket (mode 0600) where `heron run`
and `heron chat` talk to a running serve, one JSON object per line, the same messages as /ws.

Only the home's owner can connect (the socket's mode), so it needs no token. It also answers
`{"type":"conversations"}` (the list /resume offers, internal ones left out) with
`{"type":"conversations","items":[{"key","title"}...]}`, and takes a terminal's attachments
as `{"type":"upload","upload_id","name","mime","data"}` (the bytes in base64, checked against
`[attachments]`), answered `{"type":"uploaded","upload_id"}` or an `error`, for the `send`
after them to name in its `files`. `memory_waiting` and `memory_review` are a chat's
`/memory review` (docs/serve.md, "The control socket"). `{"type":"login"}` is `heron web`:
answered `{"type":"login","url","minutes"}`, a fresh one-time login address for a browser and
the minutes it works for (reaching
this socket is what lets a browser in: a sandboxed command cannot see HERON_HOME).
`{"type":"jobs_changed"}` is `heron jobs` after it changed a job: the scheduler looks now.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from heron.agent.commands import NO_MEMORY
from heron.errors import HeronError
from heron.serve.auth import CODE_SECONDS
from heron.serve.hub import Event
from heron.serve.runtime import Runtime
from heron.serve.session import Session, error

LINE_LIMIT = 64 * 1024 * 1024  # a pasted file in a message is one (long) line


class _LineTransport:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def recv(self) -> dict[str, Any] | None:
        try:
            line = await self.reader.readline()
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            return None
        if not line:
            return None
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("expected an object")
        return data

    async def send(self, event: Event) -> None:
        self.writer.write(json.dumps(event, ensure_ascii=False).encode() + b"\n")
        await self.writer.drain()

    async def close(self) -> None:
        self.writer.close()


async def start_control(
    runtime: Runtime, path: Path, login: Callable[[], str] | None = None
) -> asyncio.AbstractServer:
    """Listen on `path` (created with mode 0600 from the start: no window where others
    could connect). `login` makes a fresh login address for `heron web`."""

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        extra = _extra(runtime, login)
        session = Session(runtime, _LineTransport(reader, writer), "cli", extra=extra)
        try:
            await session.run()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    old = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(client, path=str(path), limit=LINE_LIMIT)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return server


def _extra(
    runtime: Runtime, login: Callable[[], str] | None
) -> Callable[[dict[str, Any]], Awaitable[Event | None]]:
    async def answer(message: dict[str, Any]) -> Event | None:
        if message.get("type") == "login" and login is not None:
            return {"type": "login", "url": login(), "minutes": CODE_SECONDS // 60}
        if message.get("type") == "upload":
            return await _upload(runtime, message)
        if message.get("type") in ("memory_waiting", "memory_review"):
            return await asyncio.to_thread(_memory, runtime, message)
        if message.get("type") == "jobs_changed":
            return _jobs_changed(runtime)
        if message.get("type") != "conversations":
            return None
        store = runtime.engine.store
        rows = await store.call(store.conversations, int(message.get("limit") or 20))
        return {
            "type": "conversations",
            "items": [{"key": c.key, "title": c.title} for c in rows],
        }

    return answer


def _jobs_changed(runtime: Runtime) -> Event:
    """`heron jobs` changed a job in another process: the scheduler looks at once, rather
    than at its next poll (`scheduled` false: this serve runs no scheduler to wake)."""
    poke = runtime.engine.attached.jobs_changed
    if poke is not None:
        poke()
    return {"type": "jobs_changed", "scheduled": poke is not None}


def _memory(runtime: Runtime, message: dict[str, Any]) -> Event:
    """`/memory review` of a chat through serve, in two steps: `memory_waiting` lists what
    waits (the chat shows its checklists), then `memory_review` applies what the person chose
    exactly as the in-process review does: checklists in order, each one's checked ids kept
    and the rest dropped, stopping at the first the person left with Esc (not in `shown`)."""
    from heron.memory.commands import review_text
    from heron.memory.service import REVIEW_BATCH

    kind = str(message["type"])
    service = runtime.engine.memory
    if service is None:
        return {"type": kind, "memory": False, "items": [], "text": NO_MEMORY}
    if kind == "memory_waiting":
        items = [{"id": s.id, "line": s.describe()} for s in service.waiting()]
        return {"type": kind, "memory": True, "items": items, "batch": REVIEW_BATCH}
    shown = {int(i) for i in message.get("shown") or []}
    keep = {int(i) for i in message.get("keep") or []}

    def choose(batch: list[Any]) -> set[int] | None:
        if not {s.id for s in batch} <= shown:
            return None  # a checklist the person did not see, or left with Esc
        return {s.id for s in batch} & keep

    try:
        text = review_text(service, choose, None)
    except HeronError as e:
        text = str(e)
    return {"type": kind, "memory": True, "text": text}


async def _upload(runtime: Runtime, message: dict[str, Any]) -> Event | None:
    """A terminal's attachment, its bytes in the line (base64): kept as a browser upload is
    (heron/web/uploads.py), under the same caps, for the `send` after it to name. Answered
    `uploaded`, or the error (the client shows it; the `send` is then refused too)."""
    from heron.attachments import from_bytes
    from heron.errors import AttachmentError
    from heron.web.uploads import Upload, save

    upload_id = str(message.get("upload_id") or "")
    name, mime = str(message.get("name") or "file"), str(message.get("mime") or "")
    try:
        if not re.fullmatch(r"[0-9a-f]{24}", upload_id):
            raise AttachmentError(f"not an upload id: {upload_id!r}")
        try:
            data = base64.b64decode(str(message.get("data") or ""), validate=True)
        except ValueError:
            raise AttachmentError(f"{name}: its bytes are not base64") from None
        settings = runtime.engine.settings
        # Off the loop: a PDF's pages are counted (pypdf), which a large file makes slow.
        made = await asyncio.to_thread(from_bytes, name, data, settings.config.attachments, mime)
    except AttachmentError as e:
        return {**error(e.args[0], e.hint or "Attach the file again."), "code": "upload_refused"}
    upload = Upload(upload_id, made.name or "file", made.media_type, made.size)
    await asyncio.to_thread(save, settings.paths.home, upload, data)
    return {"type": "uploaded", "upload_id": upload_id}
