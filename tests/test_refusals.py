"""Deleting a conversation is refused while proactive work needs it, and the refusal names
the cause and how to end it."""

from __future__ import annotations

import time

import pytest

from heron.channels.info import delete_conversation
from heron.config import Settings
from heron.errors import StoreError
from heron.store import Store, goals, runs


@pytest.fixture
def store():
    s = Settings.load()
    st = Store(s.paths.ensure().db)
    st.open_conversation("chat-1")
    return st


def _refusal(key: str = "chat-1") -> str:
    with pytest.raises(StoreError) as caught:
        delete_conversation(Settings.load(), key)
    return f"{caught.value} {caught.value.hint}"


def test_a_working_goal_is_named(store):
    goals.set_goal(store, "chat-1", "Migrate the blog")
    said = _refusal()
    assert "a goal is working in it ('Migrate the blog')" in said and "/goal stop" in said
    goals.end_goal(store, "chat-1", "stopped")
    delete_conversation(Settings.load(), "chat-1")  # nothing left: deleted
    assert store.conversation("chat-1") is None


def test_a_parked_goal_does_not_block(store):
    goal = goals.set_goal(store, "chat-1", "Migrate the blog")
    goals.set_status(store, goal.id, "parked")
    delete_conversation(Settings.load(), "chat-1")


def test_a_subagent_reporting_back_is_named(store):
    runs.create(store, "sa_1", "subagent", "chat-1", "crawl", status="running", lineage="l")
    said = _refusal()
    assert "subagent sa_1 will report back to it" in said and "heron runs cancel sa_1" in said
    runs.finish(store, "sa_1", "done", "ok")
    said = _refusal()
    assert "subagent sa_1 has not reported back yet (done)" in said
    runs.drop_result(store, "sa_1")
    delete_conversation(Settings.load(), "chat-1")


def test_a_waiting_question_is_named_until_its_deadline(store):
    runs.create(
        store,
        "ask_1",
        "ask",
        "chat-1",
        "Which city?",
        status="waiting",
        deadline=time.time() + 600,
    )
    said = _refusal()
    assert "run ask_1 waits for your answer ('Which city?')" in said
    assert "answer it, or drop it with heron runs cancel ask_1" in said
    with store.transaction() as c:  # its deadline passed: it no longer counts
        c.execute("UPDATE runs SET deadline = ? WHERE id = 'ask_1'", (time.time() - 1,))
    delete_conversation(Settings.load(), "chat-1")


def test_every_cause_is_named_at_once(store):
    goals.set_goal(store, "chat-1", "Tidy")
    runs.create(store, "sa_2", "subagent", "chat-1", "t", status="running", lineage="m")
    runs.create(store, "ask_2", "ask", "chat-1", "Q?", status="waiting")
    said = _refusal()
    assert "goal" in said and "sa_2" in said and "ask_2" in said


def test_a_job_bound_to_it_is_named_with_how_to_cancel(store):
    from heron.store import jobs
    from heron.store.schedule import parse

    every = parse(every="1h", timezone="UTC")
    job = jobs.create_job(store, every, conversation="chat-1", prompt="Stretch.", now=time.time())
    monitor = jobs.create_job(
        store, every, conversation="chat-1", prompt="Watch the feed", now=time.time(),
        mode="monitor",
    )  # fmt: skip
    jobs.create_job(store, every, conversation="other", prompt="Elsewhere", now=time.time())
    said = _refusal()
    assert f"reminder job {job.id} is bound to it ('Stretch.')" in said
    assert f"heron jobs cancel {job.id}" in said
    assert f"monitor job {monitor.id}" in said and f"heron jobs cancel {monitor.id}" in said
    assert "Elsewhere" not in said
    jobs.cancel_job(store, job.id)
    said = _refusal()
    assert f"job {job.id} " not in said and f"job {monitor.id}" in said
    jobs.cancel_job(store, monitor.id)
    delete_conversation(Settings.load(), "chat-1")  # a cancelled job no longer counts
    assert store.conversation("chat-1") is None
