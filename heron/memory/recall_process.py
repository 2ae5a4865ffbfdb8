"""Auto-recall's check (`auto.fires`) in a process of its own, for a busy engine.

Every turn asks whether the user's message has a hit passing auto-recall's gate before it is sent.
The answer is nearly always no, but finding that out takes a handful of full-text queries. On a
thread of the engine's own process (`RecallReader`'s first home) those queries run on the other
core, yet their Python between queries still takes the GIL from the event loop, and every hand-
off costs the loop a switch (docs/performance.md has what that cost a busy engine). A child
process has its own interpreter, so the check runs beside the loop, and the loop's share is one
line written to a pipe and one line read back.

The protocol is one JSON array per line: `[id, text, conversation_id, own]` in (`own` false:
search other conversations only, `auto.fires`), `[id, answer]` out, where
the answer is true, false, or null when the check failed (the engine then asks in-process). The
child reads through its own connection to the database (WAL: it never blocks a writer) and
exits when its stdin closes, so it never outlives the engine that started it.

    python -m heron.memory.recall_process PATH_TO_DB      (started by the engine, not by hand)
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

from heron.own_python import python_module

log = logging.getLogger(__name__)

# Seconds a check may take in the child before the engine stops asking it. A check is a few
# milliseconds; this only keeps a stuck child from holding a turn forever.
ASK_TIMEOUT = 30.0


class _Replies(asyncio.SubprocessProtocol):
    """Reads the child's answers as they arrive and resolves the futures waiting for them."""

    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future[bool | None]] = {}
        self.exited = asyncio.Event()
        self.broken = False  # it exited, said something else than an answer, or took too long
        self.transport: asyncio.BaseTransport | None = None
        self._partial = b""

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                ident, answer = json.loads(line)
            except ValueError:  # not the protocol: nothing it says can be trusted from now on
                log.warning("auto-recall process wrote %r; leaving it", line[:80])
                self.give_up()
                return
            future = self.waiting.pop(ident, None)
            if future is not None and not future.done():
                future.set_result(answer if isinstance(answer, bool) else None)

    def process_exited(self) -> None:
        self.exited.set()
        self.give_up()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def give_up(self) -> None:
        """Answer every waiting check with None (the engine asks in-process instead) and stop
        the child if it still runs."""
        self.broken = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        for future in self.waiting.values():
            if not future.done():
                future.set_result(None)
        self.waiting.clear()


class RecallProcess:
    """A running child that answers auto-recall's check; see the module docstring."""

    def __init__(self, transport: asyncio.SubprocessTransport, replies: _Replies) -> None:
        self._transport = transport
        self._replies = replies
        stdin = transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)  # stdin=PIPE in start()
        self._stdin = stdin
        self._next = 0

    @classmethod
    async def start(cls, db_path: Any, zone: str | None = None) -> RecallProcess:
        """The child on `db_path`, reading dates in the agent's `zone` (None: the system's)."""
        loop = asyncio.get_running_loop()
        transport, replies = await loop.subprocess_exec(
            _Replies,
            *python_module("heron.memory.recall_process", str(db_path), *([zone] if zone else [])),
            stderr=asyncio.subprocess.DEVNULL,
        )
        return cls(transport, replies)

    @property
    def alive(self) -> bool:
        return not self._replies.broken and not self._transport.is_closing()

    async def ask(self, text: str, conversation_id: int, own: bool = True) -> bool | None:
        """Whether `text`, typed in the conversation, has a hit passing the gate (`own`
        False: in other conversations); None when the child could not answer (it failed on
        this text, or it is gone)."""
        if not self.alive:
            return None
        self._next += 1
        future: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
        self._replies.waiting[self._next] = future
        request = [self._next, text, conversation_id, own]
        self._stdin.write((json.dumps(request) + "\n").encode())
        try:
            return await asyncio.wait_for(future, ASK_TIMEOUT)
        except TimeoutError:  # stuck: its later answers are not waited for either
            log.warning("auto-recall process did not answer in %.0f s; leaving it", ASK_TIMEOUT)
            self._replies.give_up()
            return None

    async def aclose(self, timeout: float = 5.0) -> None:
        """Close the child's stdin and wait for it to exit (it does at once); then the
        transport, which kills a child that did not."""
        if self._transport.is_closing():
            return
        self._stdin.close()
        try:
            await asyncio.wait_for(self._replies.exited.wait(), timeout)
        except TimeoutError:
            log.warning("the auto-recall process did not exit; killing it")
        self._transport.close()

    @property
    def pid(self) -> int:
        return self._transport.get_pid()


def serve(db_path: str, lines: Any = None, out: Any = None, zone: str | None = None) -> None:
    """The child's loop: answer each request line until stdin closes (dates in `zone`)."""
    from heron.memory.auto import fires
    from heron.memory.recall import Recall
    from heron.store import Store

    lines = sys.stdin if lines is None else lines
    out = sys.stdout if out is None else out
    recall = Recall(Store(db_path), zone=zone)
    for line in lines:
        ident, text, conversation_id, own = json.loads(line)
        try:
            answer: bool | None = fires(recall, text, int(conversation_id), own=bool(own))
        except Exception as e:  # answered in-process instead; the child keeps serving
            log.warning("auto-recall check failed in the child: %s", e)
            answer = None
        out.write(json.dumps([ident, answer]) + "\n")
        out.flush()


if __name__ == "__main__":
    serve(sys.argv[1], zone=sys.argv[2] if len(sys.argv) > 2 else None)
