"""Store functions of the person's messages held for a busy conversation (table `held_messages`,
migration m030) until they are stored in it.

A message sent while a turn runs there (mail, which that turn reads, or one queued behind it)
lives in the AgentLoop's memory until a turn stores it; it is written here first, before its
sender is told it was taken, so a kill -9 of the process loses none (heron/agent/loop.py). The
row is deleted in the very transaction that stores the message in the conversation (`consume`):
the run's commit of the mail, the next turn's first commit, or the kept words of a clean close.
A row whose process has ended (`left_for`) is moved in as the person's own message, with no
answer yet, by whoever next holds the conversation's lease: the next turn's RESTORE, a serve
starting (`close_dead_turns`, the relay desk's sweep); `--retry` answers it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

from heron.messages import Message, parts_from_json, parts_to_json
from heron.store.db import Store
from heron.store.process import HOST, pid_alive

T = TypeVar("T")
# This process, as its rows name it: unique even when a later process gets the same pid (a
# container restarted runs its serve under the pid the killed one had).
OWNER = f"{HOST}:{os.getpid()}:{time.time_ns():x}"


@dataclass(frozen=True)
class Held:
    """One message held for conversation `key` (of `agent`): the row it is to become."""

    id: int
    key: str
    agent: str
    message: Message
    meta: dict[str, Any] | None


def hold(store: Store, key: str, agent: str, message: Message, meta: dict[str, Any] | None) -> int:
    """Keep the person's `message` (with the `meta` it is to be stored with) for conversation
    `key` until it is stored there; returns the row's id. Its attachments' bytes are kept first,
    as a stored message's are, so the row names no file that is not kept."""
    store.files.keep(message.parts)
    with store.transaction() as c:
        cur = c.execute(
            "INSERT INTO held_messages (conversation_key, agent, parts, meta, owner, host, pid,"
            " created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key,
                agent,
                parts_to_json(message.parts),
                json.dumps(meta) if meta else None,
                OWNER,
                HOST,
                os.getpid(),
                time.time(),
            ),
        )
    assert cur.lastrowid is not None
    return cur.lastrowid


def consume(store: Store, ids: Collection[int]) -> int:
    """Delete the held rows `ids`: in the caller's transaction when it stores their message (so
    it is on disk once, held or stored, never both nor neither), or alone when their message is
    given up (its sender told it was not kept). Returns how many were still there."""
    if not ids:
        return 0
    marks = ", ".join("?" * len(ids))
    with store.transaction() as c:
        gone = c.execute(f"DELETE FROM held_messages WHERE id IN ({marks})", tuple(ids))
    return int(gone.rowcount)


def stored_with(store: Store, ids: Collection[int], write: Callable[[], T]) -> T:
    """`write`, which stores the message the held rows `ids` keep, and their deletion, in one
    transaction: no copy left held once it is stored, none stored without its row gone."""
    with store.transaction():
        consume(store, ids)
        return write()


def _ended(host: str, pid: int, owner: str) -> bool:
    """Whether the process that held a row has ended: one of this host, not this process, and
    gone (its pid free, or now this process's own). Another host's is never judged here."""
    return host == HOST and owner != OWNER and (pid == os.getpid() or not pid_alive(pid))


def left_for(store: Store, key: str) -> list[Held]:
    """The messages held for `key` by a process that has ended, in the order they came."""
    rows = store.query(
        "SELECT id, conversation_key, agent, parts, meta, owner, host, pid FROM held_messages"
        " WHERE conversation_key = ? ORDER BY id",
        (key,),
    )
    return [
        Held(r[0], r[1], r[2], Message("user", parts_from_json(r[3])), json.loads(r[4] or "null"))
        for r in rows
        if _ended(r[6], r[7], r[5])
    ]


def counts(store: Store) -> dict[str, int]:
    """How many messages are held for each conversation, by whatever process (`heron
    status`): a running turn's follow-ups, or, their process gone, what goes in next."""
    rows = store.query("SELECT conversation_key, COUNT(*) FROM held_messages GROUP BY 1")
    return {r[0]: r[1] for r in rows}


def keys_left(store: Store) -> list[str]:
    """The conversations a process that has ended left messages held for."""
    rows = store.query("SELECT DISTINCT conversation_key, owner, host, pid FROM held_messages")
    return sorted({r[0] for r in rows if _ended(r[2], r[3], r[1])})


def move_left(store: Store, key: str, conversation_id: int) -> int:
    """Under the lease of conversation `key` (id `conversation_id`): append what a process that
    ended left held for it at its head, in order, each as the person's message with no answer
    yet; returns how many this call appended."""
    return sum(_move(store, left, conversation_id) for left in left_for(store, key))


def _move(store: Store, left: Held, conversation_id: int) -> bool:
    with store.transaction():
        if consume(store, [left.id]) != 1:  # another process moved it meanwhile
            return False
        store.append(conversation_id, left.message, meta=left.meta, author="user")
    return True
