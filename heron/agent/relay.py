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

from dataclasses import dataclass
from typing import Any

from heron.agent.leases import hold_lease
from heron.agent.turn import STOPPED
from heron.messages import Message, Text
from heron.store import Store
from heron.store import engine_state as es

# Meta of the stored row: the conversation whose turn said it (`cron:3`, `heartbeat`).
RELAY_META = "spoken_in"
# What the model of the conversation reads: who said it, and that the person did not write it.
LABEL = "[Sent to the user by {who}, not written by the user] "


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
    conversation = await store.call(store.conversation, key)
    if conversation is None:
        conversation = await store.call(store.open_conversation, key, agent)
    async with hold_lease(store, conversation.id) as lease:
        if lease.dirty:
            await store.call(es.recover, store, conversation.id, STOPPED)
        shown, sent, meta = relayed.rows()
        stored = await store.call(
            store.append, conversation.id, shown, sent=sent, meta=meta, author="heron"
        )
    return stored.id
