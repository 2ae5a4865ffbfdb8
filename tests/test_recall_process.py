"""Auto-recall's check in a child process (heron/memory/recall_process.py): the child answers
what the in-process check answers, a check that fails or a child that dies falls back to the
thread, and closing the engine's reader leaves no process behind."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from heron.memory import recall_process, wiring
from heron.memory.auto import fires
from heron.memory.recall import Recall
from heron.memory.recall_process import RecallProcess, serve
from heron.messages import assistant, user
from heron.store import Store

pytestmark = pytest.mark.slow  # child processes

QUESTIONS = ["when is the passport renewal appointment", "zebra crossing", "/stop", "   "]
ASK = 1  # the conversation the questions are typed in (the fixture opens it first)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A history where one conversation talked about a passport renewal."""
    path = tmp_path / "h.db"
    store = Store(path)
    assert store.open_conversation("asking").id == ASK
    for c in range(30):
        conv = store.open_conversation(f"c{c}")
        for i in range(6):
            store.append(conv.id, user(f"c{c} message {i} about the weather"))
            store.append(conv.id, assistant("ok"))
    conv = store.open_conversation("trip")
    store.append(conv.id, user("my passport renewal appointment is on 3 March at the consulate"))
    store.close()
    return path


def expected(db: Path, own: bool = True) -> list[bool]:
    store = Store(db)
    recall = Recall(store)
    answers = [fires(recall, q, ASK, own=own) for q in QUESTIONS]
    store.close()
    return answers


def test_serve_answers_each_line_and_survives_a_failing_check(db):
    requests = [json.dumps([i, q, ASK, True]) for i, q in enumerate(QUESTIONS)]
    requests.insert(1, json.dumps([99, "passport", "not a number", True]))  # the check raises
    out = io.StringIO()
    serve(str(db), io.StringIO("\n".join(requests) + "\n"), out)
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert replies[1] == [99, None]  # failed: the engine asks in-process instead
    answers = [answer for ident, answer in replies if ident != 99]
    assert answers == expected(db)
    assert answers[0] is True and answers[1] is False  # the fixture has a strong and a weak one


def test_serve_passes_on_that_the_conversation_has_nothing_to_show(db):
    """`own` false (every message of the asking conversation in view): the child searches
    only the other conversations, as `fires(own=False)` does. Asked in the conversation that
    holds the passport message, the strong question then has nothing to fire on."""
    store = Store(db)
    trip = store.open_conversation("trip").id
    answers = {own: fires(Recall(store), QUESTIONS[0], trip, own=own) for own in (True, False)}
    store.close()
    assert answers == {True: True, False: False}
    requests = [json.dumps([i, QUESTIONS[0], trip, own]) for i, own in enumerate((True, False))]
    out = io.StringIO()
    serve(str(db), io.StringIO("\n".join(requests) + "\n"), out)
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [[0, True], [1, False]]


async def test_the_child_answers_like_the_in_process_check_and_exits_on_close(db):
    child = await RecallProcess.start(db)
    answers = await asyncio.gather(*(child.ask(q, ASK) for q in QUESTIONS))
    assert list(answers) == expected(db)
    pid = child.pid
    await child.aclose()
    assert not child.alive
    with pytest.raises(ProcessLookupError):  # exited and waited for: no zombie left
        os.kill(pid, 0)


async def test_a_dead_child_leaves_the_check_to_the_thread(db, monkeypatch):
    monkeypatch.setattr(wiring, "CHILD_AFTER", 0)
    reader = wiring.RecallReader(db)
    try:
        assert await reader.strong(QUESTIONS[0], ASK) is True  # the thread, while it starts
        await reader._starting
        assert reader._child is not None and reader._child.alive
        assert await reader.strong(QUESTIONS[0], ASK) is True  # the child
        os.kill(reader._child.pid, signal.SIGKILL)
        await asyncio.wait_for(reader._child._replies.exited.wait(), 10)
        assert await reader._child.ask(QUESTIONS[0], ASK) is None
        assert await reader.strong(QUESTIONS[0], ASK) is True  # the thread again
        assert await reader.strong(QUESTIONS[1], ASK) is False
    finally:
        await reader.aclose()


async def test_the_child_starts_only_after_enough_checks(db, monkeypatch):
    monkeypatch.setattr(wiring, "CHILD_AFTER", 3)
    reader = wiring.RecallReader(db)
    try:
        for _ in range(3):
            await reader.strong(QUESTIONS[1], ASK)
            assert reader._starting is None  # a short burst never pays for a process
        await reader.strong(QUESTIONS[1], ASK)
        assert reader._starting is not None
    finally:
        await reader.aclose()


async def _fake_child(script: str) -> RecallProcess:
    """A child that does not speak the protocol as it should."""
    loop = asyncio.get_running_loop()
    transport, replies = await loop.subprocess_exec(
        recall_process._Replies, sys.executable, "-c", script
    )
    return RecallProcess(transport, replies)


async def test_a_child_that_writes_something_else_is_left_and_stopped():
    child = await _fake_child(
        "import sys\nfor line in sys.stdin:\n    print('Warning: not an answer', flush=True)"
    )
    assert await child.ask("anything", ASK) is None
    assert not child.alive
    await asyncio.wait_for(child._replies.exited.wait(), 10)  # stopped, not left running
    assert await child.ask("anything", ASK) is None


async def test_a_stuck_child_does_not_hold_the_turn(monkeypatch):
    monkeypatch.setattr(recall_process, "ASK_TIMEOUT", 0.2)
    child = await _fake_child("import sys, time\nfor line in sys.stdin:\n    time.sleep(60)")
    assert await child.ask("anything", ASK) is None
    assert not child.alive
    await asyncio.wait_for(child._replies.exited.wait(), 10)
