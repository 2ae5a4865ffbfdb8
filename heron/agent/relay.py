"""What background work said to the person, kept in the conversation it was said to.

A monitor job and the heartbeat run their turns in conversations of their own (`cron:N`,
`heartbeat`); when their model calls the `message` tool, the text goes to the person's
conversation (the job's, `personal`). Sent only as a live event it would be gone after a reload,
lost when nobody is connected, and unknown to the model of that conversation's next turn. So it
is also stored there: one user-role row authored by Heron (never the person's words, never
quoted as theirs), appended at the head under the conversation's lease, like any turn's rows,
so it never lands inside a running turn's branch. The row shows the person the text as it was
sent (`message`); the model reads it labelled with who said it (`sent`, what `StoredMessage.wire`
gives the view). The AgentLoop decides when (after a turn running there, before the next one).

Until it is there it waits on disk (heron/store/waiting.py), written before the `message` tool
answers: a message held for a running turn survives a crash or kill -9 of the process, and the
next holder of that conversation's lease moves it in, once, before the next turn reads the
history, in whatever process (a serve, a worker, an in-process chat or run) that turn runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heron.agent.leases import hold_lease
from heron.agent.turn import STOPPED
from heron.messages import File, Message, Text
from heron.store import Store, StoredMessage, held, waiting
from heron.store import engine_state as es
from heron.store.waiting import BY_META, LABEL, RELAY_META

if TYPE_CHECKING:
    from heron.config import AttachmentCaps

log = logging.getLogger(__name__)
__all__ = ["LABEL", "RELAY_META", "RelayDesk", "Relayed", "keep_words", "move_in", "said_by"]


@dataclass(frozen=True)
class Relayed:
    """One message of background work for a conversation: its text, who said it (`who`, for the
    label: "scheduled job 3 (a monitor)") and the conversation whose turn said it."""

    text: str
    who: str
    spoken_in: str


def said_by(meta: dict[str, Any]) -> str | None:
    """Who said a kept row of background work, for the label the clients show with it (None:
    not such a row). A row kept before its sayer was stored names the conversation it was
    said in."""
    by = meta.get(BY_META)
    if by:
        return str(by)
    spoken = meta.get(RELAY_META)
    return f"background work ({spoken})" if spoken else None


async def move_in(store: Store, key: str, *, close_dead: bool = True) -> int:
    """Move the messages waiting for conversation `key` into it, in the order they were said,
    under its lease: after any turn running there, in any process. Returns how many. What the
    person sent a process that ended before storing it (heron/store/held.py) goes in first.

    A turn a dead process left open there is closed first, as the next turn would (a row must
    not cut a tool call from its result), unless `close_dead` is False: with workers
    (heron/scale/) that turn is continued by another worker, so the messages stay waiting and
    that turn's end, or the next turn's RESTORE, moves them in."""
    said = await store.call(waiting.waiting_for, store, key)
    left = await store.call(held.left_for, store, key)
    if not said and not left:
        return 0  # the common case: two indexed reads, no lease
    agent = left[0].agent if left else said[0].agent
    async with _at_head(store, key, agent, close_dead) as conversation_id:
        if conversation_id is None:
            return 0
        # The person's words first: they were sent to the turn that process ran.
        moved = await store.call(held.move_left, store, key, conversation_id)
        return moved + await store.call(waiting.move_all, store, key, conversation_id)


async def keep_words(
    store: Store,
    key: str,
    text: str,
    files: tuple[File, ...] = (),
    agent: str = "default",
    caps: AttachmentCaps | None = None,
    kept: tuple[int, ...] = (),
) -> int:
    """Store the person's message that no turn answered (a process shutting down with it
    unread, heron/agent/loop.py `close`) at the head of `key`, under its lease, as a relayed
    one goes in: their words and attachments, with no answer yet, which `heron run --retry`
    answers and the next turn there reads; the rows that `kept` it on disk meanwhile
    (heron/store/held.py) deleted in the same transaction. Returns the row's id."""
    from heron.attachments import Composed, compose
    from heron.config import AttachmentCaps

    made = compose(text, files, caps or AttachmentCaps()) if files else Composed([Text(text)])
    shown = Message("user", made.parts)
    async with _at_head(store, key, agent) as conversation_id:
        assert conversation_id is not None  # closed, not left for another worker
        append = functools.partial(
            store.append, conversation_id, shown, meta=made.meta(None), author="user"
        )
        off_loop = any(isinstance(p, File) for p in shown.parts)
        stored: StoredMessage = await store.call(
            held.stored_with, store, kept, append, off_loop=off_loop
        )
    return stored.id


@asynccontextmanager
async def _at_head(
    store: Store, key: str, agent: str, close_dead: bool = True
) -> AsyncIterator[int | None]:
    """Conversation `key` (opened for `agent` when it does not exist yet) with its lease held:
    its id, to append at its head after any turn running there, in any process. A turn a dead
    process left open there is closed first (a row must not cut a tool call from its result);
    None instead when `close_dead` is False (that turn is to be continued)."""
    conversation = await store.call(store.conversation, key)
    if conversation is None:
        conversation = await store.call(store.open_conversation, key, agent)
    async with hold_lease(store, conversation.id) as lease:
        if lease.dirty and not close_dead:
            yield None
            return
        if lease.dirty:
            await store.call(es.recover, store, conversation.id, STOPPED)
        yield conversation.id


@dataclass
class RelayDesk:
    """Background work's messages on their way into the conversations they were sent to.

    One per AgentLoop. Every message is first written to the store's waiting table (durable
    from the moment the `message` tool answers: a crash or kill -9 loses none), then moved into
    its conversation under that conversation's lease: at once, or, for a conversation whose
    turn runs in this loop, when that turn ends (`release`), never inside it. Moves into one
    conversation happen one after another, in the order said, and its next turn here waits for
    them (`settled`), so the model of that turn reads them; what is still waiting then (a dead
    process's) that turn's RESTORE moves in. A serve or worker starting moves in what any dead
    process left (`sweep`)."""

    store: Store
    # False with workers, whose turns left open by a dead process are continued, not closed.
    close_dead: bool = True
    # Per conversation, the move under way (each waits for the one before).
    _writing: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def take(self, to: str, relayed: Relayed, agent: str, *, turn_running: bool) -> str:
        """Keep `relayed` for `to` (on disk before this returns), and move it in now or once
        the turn running there ends; returns what was done, as the `message` tool tells it
        ("kept in conversation 'personal' ...")."""
        await self.store.call(
            waiting.hold, self.store, to, agent, relayed.text, relayed.who, relayed.spoken_in
        )
        if turn_running:
            return f"kept in conversation {to!r} once the turn running there ends"
        self._move_after(to)
        return f"kept in conversation {to!r}"

    def release(self, key: str) -> None:
        """The turn running in `key` ended: move in what waits for it (said meanwhile, here or
        in another process), before the next turn here."""
        self._move_after(key)

    def sweep(self) -> None:
        """Move in, in the background, what waits for any conversation (left by a process
        that died before it moved it), each after any turn running there now."""
        for key in sorted({*waiting.keys_waiting(self.store), *held.keys_left(self.store)}):
            self._move_after(key)

    async def settled(self, key: str) -> None:
        """Until the moves into `key` under way here are done (its next turn reads them)."""
        writing = self._writing.get(key)
        if writing is not None:
            await asyncio.wait({writing})  # not cancelled with the turn that waits

    @property
    def writing(self) -> bool:
        return bool(self._writing)

    async def drain(self, timeout: float | None = None) -> None:
        """Until every move under way is done (the process is about to end). After `timeout`
        seconds the rest are cancelled (one waiting for a turn of another process): what they
        would have moved stays waiting on disk, for whoever next holds its conversation."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._writing:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            _, pending = await asyncio.wait(set(self._writing.values()), timeout=left)
            if pending and deadline is not None and loop.time() >= deadline:
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending)

    def _move_after(self, key: str) -> None:
        task = asyncio.create_task(self._after(self._writing.get(key), key))
        self._writing[key] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._writing.get(key) is t:
                del self._writing[key]

        task.add_done_callback(done)

    async def _after(self, before: asyncio.Task[None] | None, key: str) -> None:
        if before is not None:
            await asyncio.wait({before})
        try:
            await move_in(self.store, key, close_dead=self.close_dead)
        except Exception:  # it stays waiting on disk; one failed move must not stop the rest
            log.exception("moving background work's messages into %s failed", key)
