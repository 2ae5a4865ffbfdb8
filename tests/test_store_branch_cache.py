"""Store.branch keeps decoded branches per conversation (keyed by head); what it returns must
always be what a fresh Store reads from the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from heron.messages import assistant, user
from heron.store import Store


def _texts(store: Store, conversation_id: int) -> list[str]:
    return [row.message.text for row in store.branch(conversation_id)]


def _fresh(path: Path, conversation_id: int) -> list[str]:
    other = Store(path)
    try:
        return _texts(other, conversation_id)
    finally:
        other.close()


def test_appends_extend_the_cached_branch(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("k")
    store.append(conv.id, user("one"))
    assert _texts(store, conv.id) == ["one"]
    store.append(conv.id, assistant("two"))
    store.append(conv.id, user("three"))
    assert _texts(store, conv.id) == ["one", "two", "three"]
    assert _texts(store, conv.id) == _fresh(tmp_path / "h.db", conv.id)


def test_moving_the_head_back_and_branching_reads_the_new_path(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("k")
    first = store.append(conv.id, user("one"))
    store.append(conv.id, assistant("two"))
    assert _texts(store, conv.id) == ["one", "two"]
    store.set_head(conv.id, first.id)
    assert _texts(store, conv.id) == ["one"]
    store.append(conv.id, assistant("other"))
    assert _texts(store, conv.id) == ["one", "other"] == _fresh(tmp_path / "h.db", conv.id)


def test_another_connection_rewriting_a_row_is_seen(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("k")
    row = store.append(conv.id, user("one"))
    assert store.branch(conv.id)[0].meta == {}
    other = Store(tmp_path / "h.db")
    other.update_meta(row.id, {"compacted": True})  # head unchanged: data_version tells
    other.close()
    assert store.branch(conv.id)[0].meta == {"compacted": True}


def test_this_stores_own_meta_update_is_seen(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("k")
    row = store.append(conv.id, user("one"))
    store.branch(conv.id)
    store.update_meta(row.id, {"recalled": [1]})
    assert store.branch(conv.id)[0].meta == {"recalled": [1]}


def test_a_rolled_back_append_leaves_no_trace_in_the_cache(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("k")
    store.append(conv.id, user("one"))
    with pytest.raises(RuntimeError), store.transaction():
        store.append(conv.id, assistant("lost"))
        assert _texts(store, conv.id) == ["one", "lost"]  # read inside: not cached
        raise RuntimeError
    assert _texts(store, conv.id) == ["one"]
    store.append(conv.id, assistant("kept"))  # may reuse the rolled-back row id
    assert _texts(store, conv.id) == ["one", "kept"] == _fresh(tmp_path / "h.db", conv.id)


def test_the_caller_cannot_change_the_cached_branch(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("k")
    store.append(conv.id, user("one"))
    store.branch(conv.id).clear()
    assert _texts(store, conv.id) == ["one"]


def _reads(store: Store) -> list[str]:
    seen: list[str] = []
    store.conn.set_trace_callback(lambda sql: seen.append(sql) if "RECURSIVE" in sql else None)
    return seen


def test_a_committed_append_is_kept_without_reading_it_back(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("k")
    store.append(conv.id, user("one"))
    assert _texts(store, conv.id) == ["one"]
    walks = _reads(store)
    store.append(conv.id, assistant("two"), meta={"ids": (1, 2)})
    turn_id, _ = store.begin_turn(conv.id, "run", user("three"), sent=user("three+"))
    rows = store.branch(conv.id)
    assert walks == []  # neither append was fetched again
    assert [r.message.text for r in rows] == ["one", "two", "three"]
    assert rows[1].meta == {"ids": [1, 2]}  # as the file gives it back
    assert rows[2].wire.text == "three+" and rows[2].turn_id == turn_id
    other = Store(tmp_path / "h.db")
    assert [(r.id, r.parent_id, r.message, r.sent, r.meta) for r in other.branch(conv.id)] == [
        (r.id, r.parent_id, r.message, r.sent, r.meta) for r in rows
    ]
    other.close()


def test_a_rolled_back_append_is_not_kept(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("k")
    store.append(conv.id, user("one"))
    assert _texts(store, conv.id) == ["one"]
    with pytest.raises(RuntimeError), store.transaction():
        store.append(conv.id, assistant("gone"))
        raise RuntimeError("abort")
    assert _texts(store, conv.id) == ["one"] == _fresh(tmp_path / "h.db", conv.id)
    store.append(conv.id, assistant("two"))
    assert _texts(store, conv.id) == ["one", "two"] == _fresh(tmp_path / "h.db", conv.id)


def test_many_short_conversations_stay_kept_and_the_bound_is_rows(tmp_path: Path, monkeypatch):
    store = Store(tmp_path / "h.db")
    ids = [store.open_conversation(f"k{i}").id for i in range(150)]
    for cid in ids:
        store.append(cid, user(f"hello {cid}"))
        store.branch(cid)
    walks = _reads(store)
    for cid in ids:  # an engine serving 150 conversations in turn: none was evicted
        store.append(cid, assistant(f"hi {cid}"))
        assert _texts(store, cid) == [f"hello {cid}", f"hi {cid}"]
    assert walks == []
    monkeypatch.setattr("heron.store.db.BRANCH_CACHE_ROWS", 10)
    for cid in ids[:20]:
        store.branch(cid, head_id=store.branch(cid)[0].id)  # a read that is kept anew
    assert store._branches.rows() <= 10
    assert all(_texts(store, cid) == _fresh(tmp_path / "h.db", cid) for cid in ids[:5])
