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
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heron.agent.leases import hold_lease
from heron.agent.turn import STOPPED
from heron.messages import File, Message, Text
from heron.store import Store
from heron.store import engine_state as es

# Meta of the stored row: the conversation whose turn said it (`cron:3`, `heartbeat`).
RELAY_META = "spoken_in"
# What the model of the conversation reads: who said it, and that the person did not write it.
LABEL = "[Sent to the user by {who}, not written by the user] "
if TYPE_CHECKING:
    from heron.config import AttachmentCaps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Relayed:
    """One message of background work for a conversation: its text, who said it (`who`, for the
    label: "scheduled job 3 (a monitor)") and the conversation whose turn said it."""

    text: str
    who: str
    spoken_in: str

    def rows(self) -> tuple[Message, Message, dict[str, Any]]:
        """The row as the person reads it, as the model reads it, and its meta."""
        shown = Message("user", [Text(self.text)])
        sent = Message("user", [Text(LABEL.format(who=self.who) + self.text)])
        return shown, sent, {RELAY_META: self.spoken_in}


async def keep(store: Store, key: str, relayed: Relayed, agent: str = "default") -> int:
    """Store `relayed` at the head of conversation `key` (opened when it does not exist yet),
    under its lease: after any turn running there, in any process. A turn left open there by a
    dead process is closed first, as its next turn would (the row must not cut a tool call from
    its result). Returns the row's id."""
    shown, sent, meta = relayed.rows()
    return await _append_at_head(store, key, agent, shown, sent, meta, "heron")


async def keep_words(
    store: Store,
    key: str,
    text: str,
    files: tuple[File, ...] = (),
    agent: str = "default",
    caps: AttachmentCaps | None = None,
) -> int:
    """Store the person's message that no turn answered (a process shutting down with it
    unread, heron/agent/loop.py `close`) at the head of `key`, as `keep` stores a relayed one:
    their words and attachments, with no answer yet, which `heron run --retry` answers and the
    next turn there reads. Returns the row's id."""
    from heron.attachments import message_parts
    from heron.config import AttachmentCaps

    parts = message_parts(text, files, caps or AttachmentCaps()) if files else [Text(text)]
    return await _append_at_head(store, key, agent, Message("user", parts), None, None, "user")


async def _append_at_head(
    store: Store,
    key: str,
    agent: str,
    shown: Message,
    sent: Message | None,
    meta: dict[str, Any] | None,
    author: str,
) -> int:
    conversation = await store.call(store.conversation, key)
    if conversation is None:
        conversation = await store.call(store.open_conversation, key, agent)
    async with hold_lease(store, conversation.id) as lease:
        if lease.dirty:
            await store.call(es.recover, store, conversation.id, STOPPED)
        stored = await store.call(
            store.append,
            conversation.id,
            shown,
            sent=sent,
            meta=meta,
            author=author,
            off_loop=any(isinstance(p, File) for p in shown.parts),
        )
    return stored.id


@dataclass
class RelayDesk:
    """Background work's messages on their way into the conversations they were sent to.

    One per AgentLoop. A message for a conversation whose turn runs is held until that turn
    ends (`release`); otherwise it is written at once. Writes to one conversation happen in the
    order they were said, one after another; its next turn waits for them (`settled`), so the
    model of that turn reads them."""

    store: Store
    # Said to a conversation while a turn ran there: written when it ends.
    _held: dict[str, list[Relayed]] = field(default_factory=dict)
    # Per conversation, the writing under way (each write waits for the one before).
    _writing: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def take(self, to: str, relayed: Relayed, agent: str, *, turn_running: bool) -> str:
        """Write `relayed` into `to`, or hold it while a turn runs there; returns what was done,
        as the `message` tool tells it ("kept in conversation 'personal' ...")."""
        if turn_running:
            self._held.setdefault(to, []).append(relayed)
            return f"kept in conversation {to!r} once the turn running there ends"
        self._write_after(to, [relayed], agent)
        return f"kept in conversation {to!r}"

    def release(self, key: str, agent: str) -> None:
        """The turn running in `key` ended: write what was held for it, before the next turn."""
        held = self._held.pop(key, None)
        if held:
            self._write_after(key, held, agent)

    async def settled(self, key: str) -> None:
        """Until what was said to `key` is written (its next turn reads it)."""
        writing = self._writing.get(key)
        if writing is not None:
            await asyncio.wait({writing})  # not cancelled with the turn that waits

    @property
    def writing(self) -> bool:
        return bool(self._writing)

    async def drain(self) -> None:
        """Until every write under way is done (the process is about to end)."""
        while self._writing:
            await asyncio.wait(set(self._writing.values()))

    def _write_after(self, key: str, said: list[Relayed], agent: str) -> None:
        task = asyncio.create_task(self._write(self._writing.get(key), key, said, agent))
        self._writing[key] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._writing.get(key) is t:
                del self._writing[key]

        task.add_done_callback(done)

    async def _write(
        self, before: asyncio.Task[None] | None, key: str, said: list[Relayed], agent: str
    ) -> None:
        if before is not None:
            await asyncio.wait({before})
        for relayed in said:
            try:
                await keep(self.store, key, relayed, agent)
            except Exception:  # the live event went out; one failed write must not stop the rest
                log.exception("storing a message of %s in %s failed", relayed.spoken_in, key)
