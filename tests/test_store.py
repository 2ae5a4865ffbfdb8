from __future__ import annotations

from pathlib import Path

from pg import raw_count

from heron.messages import Message, Text, ToolCall, ToolResult, Usage, user
from heron.store import Store
from heron.store.migrations import latest


def test_open_applies_migrations_and_wal(db):
    store = Store(db)
    if isinstance(db, Path):
        assert store.query("PRAGMA journal_mode")[0][0] == "wal"
        assert store.query("PRAGMA foreign_keys")[0][0] == 1
    names = [r[0] for r in store.query("SELECT name FROM _migrations ORDER BY name")]
    assert names[-1] == latest()
    store.close()
    # Re-opening applies nothing twice.
    again = Store(db)
    assert [r[0] for r in again.query("SELECT name FROM _migrations ORDER BY name")] == names


def test_messages_form_a_tree_and_branch_follows_head(db):
    store = Store(db)
    conv = store.open_conversation("k")
    a = store.append(conv.id, user("one"))
    b = store.append(conv.id, Message("assistant", [Text("first answer")]))
    # A retry: a sibling of b under a; b stays in the record.
    c = store.append(conv.id, Message("assistant", [Text("second answer")]), parent_id=a.id)
    assert [m.id for m in store.branch(conv.id)] == [a.id, c.id]
    assert [m.id for m in store.branch(conv.id, b.id)] == [a.id, b.id]
    assert [m.id for m in store.children(a.id)] == [b.id, c.id]


def test_begin_turn_commits_user_message_with_turn(db):
    store = Store(db)
    conv = store.open_conversation("k")
    turn_id, stored = store.begin_turn(conv.id, "run_1", user("hello"), model="m")
    # Visible from a separate connection: it is committed, not just buffered.
    assert raw_count(db, "SELECT turn_id FROM messages WHERE id=?", (stored.id,)) == turn_id
    turn = store.turn("run_1")
    assert turn is not None and turn.status == "running" and turn.user_message_id == stored.id
    store.finish_turn(
        turn_id,
        status="done",
        stop_reason="done",
        usage=Usage(10, 2, 5, 0),
        model_calls=1,
        tool_calls=0,
    )
    done = store.turn("run_1")
    assert done is not None and done.status == "done" and done.usage == Usage(10, 2, 5, 0)


def test_sent_parts_kept_apart_from_what_the_user_typed(db):
    store = Store(db)
    conv = store.open_conversation("k")
    typed = user("hi")
    sent = Message("user", [Text("hi"), Text("[runtime] time: noon")])
    store.append(conv.id, typed, sent=sent)
    [row] = store.branch(conv.id)
    assert row.message == typed and row.wire == sent


def test_corrupt_row_is_reported_in_place_not_raised(db):
    store = Store(db)
    conv = store.open_conversation("k")
    m = store.append(conv.id, Message("assistant", [ToolCall("1", "bash", {"command": "ls"})]))
    store.append(conv.id, Message("user", [ToolResult("1", "ok")]))
    # Valid JSON (index triggers parse it) but not a list of parts Heron knows.
    bad = '[{"kind": "hologram", "text": "keep me"}]'
    store.conn.execute("UPDATE messages SET parts = ? WHERE id = ?", (bad, m.id))
    rows = store.branch(conv.id)
    assert "could not be read" in rows[0].message.text
    assert "keep me" in rows[0].message.text
    assert len(rows) == 2


def test_failed_transaction_leaves_nothing(db):
    store = Store(db)
    conv = store.open_conversation("k")
    try:
        with store.transaction():
            store.append(conv.id, user("lost"))
            raise RuntimeError("crash mid-save")
    except RuntimeError:
        pass
    assert store.branch(conv.id) == []
    assert store.conversation("k").head_id is None


def test_delete_conversation_cascades(db):
    store = Store(db)
    conv = store.open_conversation("k")
    store.begin_turn(conv.id, "run_x", user("hi"))
    store.delete_conversation(conv.id)
    assert store.conversation("k") is None
    assert store.query("SELECT COUNT(*) FROM messages")[0][0] == 0
    assert store.query("SELECT COUNT(*) FROM turns")[0][0] == 0


def test_a_conversation_of_thousands_of_messages_deletes(db):
    """Each message names the one before it (ON DELETE CASCADE): deleting the first went down
    the chain one level per message, and SQLite stops at 1,000 ("too many levels of trigger
    recursion"), so a conversation of 530 turns could not be deleted."""
    store = Store(db)
    conv = store.open_conversation("long")
    other = store.open_conversation("other")
    store.append(other.id, user("kept"))
    with store.transaction():
        for i in range(1_200):
            store.append(conv.id, user(f"message {i}"))
    store.delete_conversation(conv.id)
    assert store.conversation("long") is None
    assert store.query("SELECT COUNT(*) FROM messages")[0][0] == 1
    assert [r.message.text for r in store.branch(other.id)] == ["kept"]


def test_stored_messages_behave_as_plain_messages(db):
    store = Store(db)
    conv = store.open_conversation("k")
    plain = Message("assistant", [Text("hi"), ToolCall("1", "bash", {"command": "ls"})])
    store.append(conv.id, plain)
    [row] = Store(db).branch(conv.id)  # read back by a fresh store: from disk
    assert row.message == plain and plain == row.message
    text_only = Message("user", [Text("just words")])
    store.append(conv.id, text_only)
    again = Store(db).branch(conv.id)[-1].message
    assert hash(again) == hash(text_only) and {again, text_only} == {text_only}
    assert row.message.tool_calls[0].args == {"command": "ls"} and row.message.text == "hi"


def test_turns_since_the_last_separator_count_on_both_backends(db):
    """What a conversation of repeated checks still shows its model (`TurnOptions.fresh_after`),
    on both backends: counted by row ids, so a separator and the turn right after it may share
    a wall-clock time (`?1` placeholders are SQLite's own: PostgreSQL's translation does not
    read them)."""
    from heron.store import engine_state as es

    store = Store(db)
    conv = store.open_conversation("beat")
    store.begin_turn(conv.id, "run_1", user("one"))
    assert es.turns_since_separator(store, conv.id) == 1
    store.append(conv.id, Message("assistant", [Text("--- new ---")]), kind="separator")
    assert es.turns_since_separator(store, conv.id) == 0
    store.begin_turn(conv.id, "run_2", user("two"))
    assert es.turns_since_separator(store, conv.id) == 1


def test_a_fresh_start_writes_its_separator_once_due_and_says_how_the_last_turn_ended(db):
    """`es.fresh_start` (TurnOptions.fresh_after) on both backends: nothing before `after`
    turns; then one separator at the head, and the last turn's last reply with text."""
    from heron.store import engine_state as es

    store = Store(db)
    conv = store.open_conversation("cron:1")
    for n in (1, 2):
        turn_id, _ = store.begin_turn(conv.id, f"run_{n}", user(f"check {n}"))
        store.append(conv.id, Message("assistant", [Text(f"all green ({n})")]), turn_id=turn_id)
        store.append(conv.id, Message("assistant", [Text("   ")]), turn_id=turn_id)
        assert es.fresh_start(store, conv.id, 3, "--- new ---") is None
    note = es.fresh_start(store, conv.id, 2, "--- new ---")
    assert note is not None and note.text == "all green (2)" and note.ended > 0
    rows = store.branch(conv.id)
    assert [r.kind for r in rows][-1] == "separator"
    assert es.fresh_start(store, conv.id, 2, "--- new ---") is None  # nothing since it
