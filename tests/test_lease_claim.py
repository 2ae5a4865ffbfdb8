"""A won lease claim reports the conversation's epoch and whether an earlier turn left work to
recover (read in the claim's own transaction): a turn still marked running, a checkpoint, or a
head that asks for tools nobody answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from heron.messages import Message, Text, ToolCall, Usage
from heron.store import Store
from heron.store import engine_state as es


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "heron.db")


def claim(store: Store, cid: int) -> es.Claim:
    won = es.try_lease(store, cid, "me", 30.0)
    es.release_lease(store, cid, "me")
    assert won.holder is None
    return won


def test_a_clean_conversation_is_not_dirty_and_reports_its_epoch(store):
    cid = store.open_conversation("k").id
    store.append(cid, Message("user", [Text("hi")]))
    assert (claim(store, cid).epoch, claim(store, cid).dirty) == (0, False)
    es.bump_epoch(store, cid)
    assert claim(store, cid).epoch == 1


def test_a_turn_left_running_makes_it_dirty_until_it_is_finished(store):
    cid = store.open_conversation("k").id
    turn_id, _ = store.begin_turn(cid, "run-1", Message("user", [Text("hi")]))
    assert claim(store, cid).dirty
    store.finish_turn(
        turn_id, status="done", stop_reason="done", usage=Usage(), model_calls=0, tool_calls=0
    )
    assert not claim(store, cid).dirty


def test_a_checkpoint_left_makes_it_dirty(store):
    cid = store.open_conversation("k").id
    cp = es.Checkpoint(cid, 1, 0, ["c1"], [])
    assert es.write_checkpoint(store, cp, None)
    assert claim(store, cid).dirty
    es.clear_checkpoint(store, cid)
    assert not claim(store, cid).dirty


def test_a_head_asking_for_tools_makes_it_dirty_but_a_plain_reply_does_not(store):
    cid = store.open_conversation("k").id
    store.append(cid, Message("user", [Text("run it")]))
    store.append(cid, Message("assistant", [Text("sure")]))
    assert not claim(store, cid).dirty
    store.append(cid, Message("assistant", [ToolCall("c1", "bash", {"cmd": "ls"})]))
    assert claim(store, cid).dirty
