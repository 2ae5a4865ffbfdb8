"""Store functions of background work's messages that wait to enter a conversation (table
`waiting_messages`, migration m026), and the row each becomes there.

What a monitor or the heartbeat says with `message` to another conversation is written here
before the `message` tool answers, then moved into that conversation by whoever next holds
its lease: the process that took it (at once, or when the turn running there ends), a serve or
worker starting, or the next turn there before it reads the history (RESTORE,
heron/agent/turn.py). A move deletes the row and appends the message in one transaction, and
appends nothing when the row is gone already, so a message is stored once even when two
processes both try. The AgentLoop's side is heron/agent/relay.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from heron.messages import Message, Text
from heron.store.db import Store

# Meta of the stored row: the conversation whose turn said it (`cron:3`, `heartbeat`), and
# who said it, as the person reads it ("the heartbeat check": heron/agent/relay.py `said_by`).
RELAY_META = "spoken_in"
BY_META = "said_by"
# What the model of the conversation reads: who said it, and that the person did not write it.
LABEL = "[Sent to the user by {who}, not written by the user] "


@dataclass(frozen=True)
class Waiting:
    """One waiting message: for conversation `key` (of `agent`), said by `who` ("scheduled
    job 3 (a monitor)") in the turn of conversation `spoken_in`."""

    id: int
    key: str
    agent: str
    text: str
    who: str
    spoken_in: str

    def rows(self) -> tuple[Message, Message, dict[str, Any]]:
        """The row as the person reads it, as the model reads it, and its meta: one user-role
        row authored by Heron, never the person's words."""
        shown = Message("user", [Text(self.text)])
        sent = Message("user", [Text(LABEL.format(who=self.who) + self.text)])
        return shown, sent, {RELAY_META: self.spoken_in, BY_META: self.who}


def hold(store: Store, key: str, agent: str, text: str, who: str, spoken_in: str) -> int:
    """Keep a message for conversation `key` until it is moved in; returns its id."""
    with store.transaction() as c:
        cur = c.execute(
            "INSERT INTO waiting_messages (conversation_key, agent, text, who, spoken_in,"
            " created) VALUES (?, ?, ?, ?, ?, ?)",
            (key, agent, text, who, spoken_in, time.time()),
        )
    assert cur.lastrowid is not None
    return cur.lastrowid


def waiting_for(store: Store, key: str) -> list[Waiting]:
    """The messages waiting for conversation `key`, in the order they were said."""
    rows = store.query(
        "SELECT id, conversation_key, agent, text, who, spoken_in FROM waiting_messages"
        " WHERE conversation_key = ? ORDER BY id",
        (key,),
    )
    return [Waiting(*r) for r in rows]


def counts(store: Store) -> dict[str, int]:
    """How many messages wait for each conversation (`heron status`)."""
    rows = store.query("SELECT conversation_key, COUNT(*) FROM waiting_messages GROUP BY 1")
    return {r[0]: r[1] for r in rows}


def keys_waiting(store: Store) -> list[str]:
    """The conversations some message waits for."""
    rows = store.query("SELECT DISTINCT conversation_key FROM waiting_messages ORDER BY 1")
    return [r[0] for r in rows]


def move_all(store: Store, key: str, conversation_id: int) -> int:
    """Under the lease of conversation `key` (id `conversation_id`): append what waits for it
    at its head, in the order said; returns how many this call appended."""
    return sum(_move(store, said, conversation_id) for said in waiting_for(store, key))


def _move(store: Store, said: Waiting, conversation_id: int) -> bool:
    shown, sent, meta = said.rows()
    with store.transaction() as c:
        gone = c.execute("DELETE FROM waiting_messages WHERE id = ?", (said.id,))
        if gone.rowcount != 1:  # another process moved it meanwhile
            return False
        store.append(conversation_id, shown, sent=sent, meta=meta, author="heron")
    return True
