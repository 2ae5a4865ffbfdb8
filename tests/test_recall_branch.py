"""What recall keeps between its looks to stay fast on a large history gives the answers a
fresh look gives (issue 17, auto-recall's cost at 100,000 messages):

- `Recall.on_branch` keeps what it found of a conversation's branch while the head stays; a
  head moved by `/retry`, `/edit` or `/tree`, or a conversation deleted and another made with
  its id, is looked at again;
- `Recall.frequencies` counts a word's matches only as far as the caller needs, and counts
  further when a later caller needs more;
- SQLite walks a branch through the index of (id, parent_id), not the table's rows.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from heron.memory import recall as recall_module
from heron.memory import records
from heron.memory.recall import Recall
from heron.messages import Message, Text
from heron.store import Store


def _say(store: Store, conversation_id: int, text: str, parent_id: object = None) -> int:
    message = Message("user", [Text(text)])
    if parent_id is None:
        return store.append(conversation_id, message).id
    return store.append(conversation_id, message, parent_id=parent_id).id


def test_a_moved_head_is_looked_at_again(db: str | Path) -> None:
    store = Store(db)
    try:
        conv = store.open_conversation("c").id
        first = _say(store, conv, "the old question")
        kept = _say(store, conv, "the answer that stays")
        replaced = _say(store, conv, "an answer retried away")
        recall = Recall(store)
        assert recall.on_branch([first, kept, replaced]) == {first, kept, replaced}
        retried = _say(store, conv, "the retried answer", parent_id=kept)  # a sibling
        assert recall.on_branch([replaced, retried, first]) == {retried, first}
        store.set_head(conv, replaced)  # /tree back to the first branch
        assert recall.on_branch([replaced, retried]) == {replaced}
        assert recall.on_branch([replaced]) == Recall(store).on_branch([replaced])
    finally:
        store.close()


def test_a_new_conversation_with_a_deleted_ones_id_is_looked_at_again(tmp_path: Path) -> None:
    """SQLite gives a new row the id after the largest left: the newest conversation and its
    messages, deleted, leave their ids to the next ones."""
    store = Store(tmp_path / "h.db")
    try:
        gone = store.open_conversation("gone").id
        root = _say(store, gone, "a first line")
        head = _say(store, gone, "a second line")
        recall = Recall(store)
        assert recall.on_branch([root, head]) == {root, head}
        store.delete_conversation(gone)
        again = store.open_conversation("again").id
        assert again == gone
        new_root = _say(store, again, "another first line")
        assert new_root == root
        # a second root: the first is then off the branch, its id asked about before
        with store.transaction() as c:
            c.execute("UPDATE conversations SET head_id = NULL WHERE id = ?", (again,))
        new_head = _say(store, again, "a line of its own")
        assert new_head == head
        assert recall.on_branch([root, head]) == {head}
    finally:
        store.close()


def test_counts_are_exact_as_far_as_asked_and_counted_further_when_needed(
    db: str | Path,
) -> None:
    store = Store(db)
    try:
        conv = store.open_conversation("c").id
        for n in range(30):
            _say(store, conv, f"common words number {n}")
        _say(store, conv, "a rare common sight")
        recall = Recall(store)
        bounded = recall.frequencies("rare common", 5)
        assert bounded == {"rare": 1, "common": 6}  # 6: more than the 5 asked about
        assert recall.frequencies("rare common") == {"rare": 1, "common": 31}
        assert recall.frequencies("rare common", 5) == {"rare": 1, "common": 31}
    finally:
        store.close()


def test_sqlite_walks_a_branch_through_the_index_of_parents(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    try:
        sql = records._ON_CHAIN_SQL.format(indexed=records._PARENT_OF, marks="?")
        plan = " ".join(str(row) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", (1, 1, 1)))
        assert "COVERING INDEX messages_parent_of" in plan
    finally:
        conn.close()


def test_more_conversations_than_are_kept_are_answered_in_one_ask(
    db: str | Path, monkeypatch
) -> None:
    monkeypatch.setattr(recall_module, "CHAINS_KEPT", 2)
    store = Store(db)
    try:
        ids = []
        for n in range(5):
            conv = store.open_conversation(f"c{n}").id
            ids.append(_say(store, conv, f"line {n}"))
            _say(store, conv, f"next line {n}")
        recall = Recall(store)
        assert recall.on_branch(ids) == set(ids)
        assert recall.on_branch(list(reversed(ids))) == set(ids)
    finally:
        store.close()
