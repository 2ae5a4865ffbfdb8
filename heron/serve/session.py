"""One client's session, whatever carries it: a browser's /ws or a terminal's control socket.

The client says `hello` first (which conversation, the last seq it saw), then sends messages,
commands, stops and answers to approvals (heron/agent/approvals.py); the hub queues what it
should see and a writer task sends it. The protocol is documented in docs/web.md
("## Protocol").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from heron.agent.commands import typo_notice
from heron.errors import HeronError
from heron.messages import File, new_key, oversized
from heron.serve.hub import Client, Event
from heron.serve.runtime import Runtime

DEFAULT_CONVERSATION = "personal"
CHANNELS = ("web", "cli", "script", "terminal")
_ids = itertools.count(1)
# What a client can send only once attached to a conversation (after `hello`).
ATTACHED = ("send", "stop", "command", "approve", "work", "cancel", "job")


class Transport(Protocol):
    async def recv(self) -> dict[str, Any] | None:
        """The next message; None when the client left. Raises ValueError on bad JSON."""
        ...

    async def send(self, event: Event) -> None: ...

    async def close(self) -> None:
        """Close the connection (shutdown): the client's next read sees it end."""
        ...


def error(message: str, hint: str) -> Event:
    return {"type": "error", "message": message, "hint": hint}


# The `code` of an error that answers a send or command the serve did not take: the client
# stops waiting for its turn (a thin client exits 2, as the same input does in-process).
REFUSED = "refused"


# The last event every client hears when the serve shuts down (then its socket closes).
STOPPED: Event = {
    **error(
        "heron serve stopped",
        "Start it again with `heron serve`; heron run and heron chat work without it too.",
    ),
    "code": "serve_stopped",
}
END_WAIT = 5.0  # seconds a client's queued events may take to go out at shutdown


class Session:
    """Reads a client's messages and hands them to the runtime."""

    def __init__(
        self,
        runtime: Runtime,
        transport: Transport,
        channel: str,
        extra: Callable[[dict[str, Any]], Awaitable[Event | None]] | None = None,
    ) -> None:
        self.runtime = runtime
        self.transport = transport
        self.client = Client(channel, f"{channel}-{next(_ids)}")
        self.agent = "default"
        self.extra = extra  # requests only this transport answers (the control socket's)
        self._writer: asyncio.Task[None] | None = None

    async def run(self) -> None:
        writer = self._writer = asyncio.create_task(self._write())
        self.runtime.sessions.add(self)
        try:
            if self.runtime.closed:  # connected while the serve shuts down
                await self.end()
            await self._read()
        finally:
            self.runtime.sessions.discard(self)
            self.runtime.hub.detach(self.client)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer

    async def _write(self) -> None:
        queue = self.client.queue
        while True:
            event = await queue.get()
            try:
                await self.transport.send(event)
            finally:
                queue.task_done()

    async def end(self) -> None:
        """Shutdown: what is queued goes out (the stopped turn's end), then STOPPED, then the
        connection closes, so the client knows the serve is gone instead of waiting."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.client.queue.join(), END_WAIT)
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._writer
        with contextlib.suppress(Exception):
            await self.transport.send(dict(STOPPED))
        with contextlib.suppress(Exception):
            await self.transport.close()

    async def _read(self) -> None:
        while True:
            try:
                message = await self.transport.recv()
            except ValueError as e:
                await self._reply(error(f"not a JSON object: {e}", "Send one JSON object."))
                continue
            if message is None:
                return
            await self.handle(message)

    async def _reply(self, event: Event) -> None:
        """An answer to this client alone, in order with its events."""
        self.client.queue.put_nowait(event)

    async def handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "hello":
            self._hello(message)
        elif self.client.key is None and kind in ATTACHED:
            await self._reply(error("say hello first", 'Send {"type":"hello"} to attach.'))
        elif kind == "send":
            await self._send(message)
        elif kind == "stop":
            self._submit("/stop")
        elif kind == "command":
            await self._command(message)
        elif kind in ("work", "cancel", "job"):
            await self._work(message)
        elif kind == "approve":
            await self._approve(message)
        elif self.extra is not None and (answer := await self.extra(message)) is not None:
            await self._reply(answer)
        else:
            await self._reply(
                error(
                    f"unknown message type {kind!r}",
                    "Use hello, send, stop, command, approve, work, cancel or job.",
                )
            )

    def _hello(self, message: dict[str, Any]) -> None:
        key = str(message.get("conversation") or DEFAULT_CONVERSATION)
        channel = message.get("channel")
        if isinstance(channel, str) and channel in CHANNELS:
            self.client.channel = channel
        if isinstance(message.get("agent"), str):
            self.agent = message["agent"]
        last = message.get("last_seq", 0)
        instance = message.get("instance")  # the serve that numbered last_seq
        self.runtime.hub.attach(
            self.client,
            key,
            last if isinstance(last, int) else None,
            instance if isinstance(instance, str) else None,
        )

    async def _send(self, message: dict[str, Any]) -> None:
        text = message.get("text")
        refs = message.get("files") or []
        if not isinstance(text, str) or (not text.strip() and not refs):
            await self._reply(error("the message is empty", "Type something to send."))
            return
        # A refusal of a send carries its text: the browser has cleared its box, and puts the
        # text back (qa24c C1: a send refused for a broken config.toml was lost). Not one too
        # large to take: it would not fit a frame back either (the browser checks the size
        # before it sends, heron/web/static/app.js `send`, and keeps such a text).
        too_large = oversized(text)
        if too_large is not None:
            said, _, hint = too_large.partition(". ")
            await self._reply({**error(said, hint), "code": REFUSED})
            return
        typo = typo_notice(text) if self.client.channel == "web" else None
        if typo is not None:  # as `heron chat` says it
            await self._reply({**error(typo, "Nothing was sent."), "code": REFUSED, "text": text})
            return
        if await self._refused(text):
            return
        files = await self._files(refs, text)
        if files is None:
            return
        if message.get("new_thread"):
            self.runtime.hub.attach(self.client, new_key("run"), None)
        self._submit(text, files)

    async def _files(self, refs: Any, text: str) -> tuple[File, ...] | None:
        """A send's uploads as File parts (heron/web/uploads.py); None, with an error to this
        client, when one is missing or they pass the cap: nothing is sent half attached."""
        if not refs:
            return ()
        from heron.web.uploads import uploaded_files

        settings = self.runtime.engine.settings
        home, caps = settings.paths.home, settings.config.attachments
        try:
            return await asyncio.to_thread(uploaded_files, home, refs, caps)
        except HeronError as e:
            refused = error(e.args[0] if e.args else str(e), e.hint or "Attach again.")
            await self._reply({**refused, "code": REFUSED, "text": text})  # nothing was sent
            return None

    async def _command(self, message: dict[str, Any]) -> None:
        text = message.get("text")
        if not isinstance(text, str) or not text.startswith("/"):
            await self._reply(error("a command starts with /", "Try /help."))
            return
        if text.strip() == "/stop":  # as `stop`: never refused, a broken config.toml included
            self._submit("/stop")
            return
        if await self._refused(text):
            return
        self._submit(text)

    async def _refused(self, text: str) -> bool:
        """A config.toml broken since the serve started refuses what would start a turn; the
        refusal gives the client its `text` back (said as `heron run` in-process says it:
        tests/test_bad_input_modes.py)."""
        problem = await self.runtime.config_problem()
        if problem is None:
            return False
        message = problem.args[0] if problem.args else str(problem)
        await self._reply({**error(message, problem.hint or ""), "code": REFUSED, "text": text})
        return True

    async def _work(self, message: dict[str, Any]) -> None:
        """The conversation's proactive work, a cancel of one piece, or a pause, resume or
        run-now of one of its jobs (heron/serve/work.py)."""
        from heron.serve import work

        store, key = self.runtime.engine.store, self.client.key
        assert key is not None
        zone = self.runtime.engine.settings.timezone  # the agent's: every time it shows
        poke = self.runtime.engine.attached.jobs_changed  # this serve's scheduler, if any
        if message.get("type") == "work":
            await self._reply(await store.call(work.work_event, store, key, zone))
        elif message.get("type") == "job":
            now, can_run = time.time(), poke is not None
            answer = await store.call(work.control, store, key, zone, message, now, can_run)
            if poke is not None and answer.get("type") == "work":
                poke()  # a resumed job's next instant, a run asked for: looked at now
            await self._reply(answer)
        else:
            await self._reply(await store.call(work.cancel, store, key, zone, message))

    async def _approve(self, message: dict[str, Any]) -> None:
        """The answer to a command waiting for approval (heron/agent/approvals.py): every
        client hears how it was decided (`approval_end`); one that came too late is ignored."""
        approval_id, allow = message.get("id"), message.get("allow")
        if not isinstance(approval_id, str) or not isinstance(allow, bool):
            hint = 'Send {"type":"approve","id":"<the approval\'s id>","allow":true}.'
            await self._reply(error("approve needs the approval's id and allow", hint))
            return
        client = self.client
        if client.key is None:
            return
        if not self.runtime.approvals.answer(client.key, approval_id, allow, client.chat_id):
            # Not waiting in this process: a worker's turn may be (heron/scale/front.py).
            await self.runtime.loop.answer_elsewhere(client.key, approval_id, allow, client.chat_id)

    def _submit(self, text: str, files: tuple[File, ...] = ()) -> None:
        client, key = self.client, self.client.key
        assert key is not None
        self.runtime.submit(text, key, client.channel, client.chat_id, self.agent, files)
