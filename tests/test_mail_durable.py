"""What the person sends while a turn runs is on disk before they are told it was taken: a
follow-up mailed into the turn, and a message (with its attachment) queued behind it. A kill -9
of the process holding the turn loses neither: the next turn there, or a serve starting
(`close_dead_turns`), moves them in as the person's own unanswered messages, in order, once;
`--retry` answers them. A run that reads the mail, and a clean close, store each once and leave
nothing held (heron/store/held.py, docs/engine.md "Mail")."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from engine_child import MAILED, QUEUED
from procs import reap, spawn  # noqa: F401  (reap: an autouse fixture)
from test_engine_loop import _gate_registry
from waiting import until

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.agent.turn import STOPPED
from heron.bus import InboundMessage, MessageBus
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider
from heron.store import Store, StoredMessage
from heron.store import engine_state as es
from heron.tools.registry import ToolRegistry

CHILD = str(Path(__file__).with_name("engine_child.py"))


def _held(store: Store) -> int:
    return int(store.query("SELECT COUNT(*) FROM held_messages")[0][0])


def _killed_after_the_follow_ups_were_taken(key: str) -> None:
    """A child process's turn in `key` takes a follow-up as mail and queues a message with a
    file behind it, says so to their senders, and is killed with -9."""
    Store(Settings.load().paths.db).close()  # migrated before the child opens it
    child = spawn([sys.executable, CHILD, "mail", key])
    assert child.stdout is not None
    told = child.stdout.readline()
    assert json.loads(told or "null") == ["mail", "queued"], child.stderr
    child.kill()
    child.wait(30)


def _persons(rows: list[StoredMessage], text: str) -> list[StoredMessage]:
    return [r for r in rows if r.role == "user" and text in r.message.text]


@pytest.mark.slow  # a child process and kill -9
async def test_mail_and_a_queued_message_survive_a_kill_9_and_the_next_turn_reads_them():
    _killed_after_the_follow_ups_were_taken("k")
    provider = ScriptedProvider([Reply([Text("Blue, and the notes read.")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("k", "are you there?")
        store = engine.store
        conversation = store.conversation("k")
        assert conversation is not None
        rows = store.branch(conversation.id)
        held = _held(store)
    assert result.ok and held == 0
    texts = [r.message.text for r in rows]
    mailed, queued = _persons(rows, MAILED), _persons(rows, QUEUED)
    assert len(mailed) == 1 and len(queued) == 1  # once each
    assert mailed[0].author == "user" and queued[0].author == "user"
    assert "the attached line" in queued[0].message.text  # its attachment came with it
    # After the killed turn and its stopped note, in the order sent, before the next message.
    stopped = texts.index(STOPPED)
    asked = texts.index("are you there?")
    assert stopped < texts.index(mailed[0].message.text) < texts.index(queued[0].message.text)
    assert texts.index(queued[0].message.text) < asked
    seen = " ".join(m.text for m in provider.requests[0].messages)
    assert MAILED in seen and QUEUED in seen  # the next turn's model reads them


@pytest.mark.slow  # a child process and kill -9
async def test_a_serve_starting_after_a_kill_9_moves_the_follow_ups_in_and_retry_answers():
    _killed_after_the_follow_ups_were_taken("k")
    store = Store(Settings.load().paths.db)
    try:
        es.close_dead_turns(store, STOPPED)  # what a serve starting does first
        conversation = store.conversation("k")
        assert conversation is not None
        rows = store.branch(conversation.id)
        assert _held(store) == 0
    finally:
        store.close()
    assert [r.message.text for r in rows][-2:][0] == MAILED
    assert rows[-1].author == "user" and QUEUED in rows[-1].message.text
    provider = ScriptedProvider([Reply([Text("Read it.")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("k", "/retry unanswered")
        after = engine.store.branch(conversation.id)
    assert result.ok and after[-1].message.text == "Read it."
    assert after[-2].id == rows[-1].id  # answered where it stands: stored once
    assert QUEUED in provider.requests[0].messages[-1].text


GATED = Reply([ToolCall("c1", "wait_gate", {})], "tool")


@contextlib.asynccontextmanager
async def _mailed(provider: ScriptedProvider, registry: ToolRegistry) -> AsyncIterator[AgentLoop]:
    """A loop whose turn in `k` waits on the gate, with "make it blue" mailed into it."""
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, MessageBus())
        await loop.dispatch(InboundMessage("t", "1", "start the job", "k"))
        await until(lambda: len(provider.requests) == 1)
        await loop.dispatch(InboundMessage("t", "1", "make it blue", "k"))
        yield loop


def _rows_and_held(loop: AgentLoop) -> tuple[list[StoredMessage], int]:
    store = loop.engine.store
    conversation = store.conversation("k")
    assert conversation is not None
    return store.branch(conversation.id), _held(store)


async def test_mail_the_run_reads_is_stored_once_and_leaves_nothing_held():
    registry, gate, _ = _gate_registry()
    provider = ScriptedProvider([GATED, Reply([Text("Blue.")], "done")])
    async with _mailed(provider, registry) as loop:
        assert _held(loop.engine.store) == 1  # on disk before the sender is told
        gate.set()
        await loop.wait_idle()
        rows, held = _rows_and_held(loop)
    assert held == 0
    assert len(_persons(rows, "make it blue")) == 1


async def test_a_clean_close_stores_mail_and_queued_messages_once_and_leaves_nothing_held():
    registry, _, _ = _gate_registry()
    async with _mailed(ScriptedProvider([GATED]), registry) as loop:
        loop._active["k"].control.accepting_mail = False  # past its last drain: queued
        await loop.dispatch(InboundMessage("t", "1", "and green", "k"))
        assert loop.pending("k") == 1 and _held(loop.engine.store) == 2
        await loop.close()
        rows, held = _rows_and_held(loop)
    assert held == 0
    kept = _persons(rows, "make it blue")
    assert len(kept) == 1 and kept[0].message.text == "make it blue\n\nand green"


async def test_mail_a_stop_overtook_opens_the_next_turn_and_leaves_nothing_held():
    registry, _, _ = _gate_registry()
    provider = ScriptedProvider([GATED, Reply([Text("Blue.")], "done")])
    async with _mailed(provider, registry) as loop:
        await loop.dispatch(InboundMessage("t", "1", "/stop", "k"))
        await loop.wait_idle()
        rows, held = _rows_and_held(loop)
    assert held == 0
    assert len(_persons(rows, "make it blue")) == 1 and rows[-1].message.text == "Blue."
