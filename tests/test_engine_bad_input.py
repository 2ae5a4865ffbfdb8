"""The engine against a database that changes under it, and /retry of a failed turn."""

from __future__ import annotations

import logging
import os
import shutil

from heron.agent.engine import Engine
from heron.config import Settings
from heron.errors import AuthError
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.store import Store


def _ok(text: str) -> Reply:
    return Reply([Text(text)], "done", Usage(10, 2))


def _typed(store: Store, key: str) -> list[tuple[str, str]]:
    conversation = store.conversation(key)
    assert conversation is not None
    return [(r.role, r.message.text) for r in store.branch(conversation.id)]


async def test_a_database_deleted_during_a_chat_is_written_back_and_nothing_lost(caplog):
    settings = Settings.load()
    provider = ScriptedProvider([_ok("first answer"), _ok("second answer")])
    with caplog.at_level(logging.WARNING):
        async with Engine.open(settings, provider=provider) as engine:
            await engine.turn("chat", "first question")
            os.remove(settings.paths.db)  # what `rm heron.db` does while the chat is open
            second = await engine.turn("chat", "second question")
    assert second.ok and second.text == "second answer"
    assert "was deleted while Heron had it open; it was written back" in caplog.text
    store = Store(settings.paths.db)  # the file on disk, opened afresh: everything is in it
    assert _typed(store, "chat") == [
        ("user", "first question"),
        ("assistant", "first answer"),
        ("user", "second question"),
        ("assistant", "second answer"),
    ]
    store.close()


async def test_a_database_replaced_by_another_file_is_used_with_a_warning(caplog, tmp_path):
    settings = Settings.load()
    other = tmp_path / "other.db"
    seeded = Store(other)
    seeded.append(seeded.open_conversation("elsewhere").id, Reply([Text("kept")], "done").message)
    seeded.close()
    provider = ScriptedProvider([_ok("one"), _ok("two")])
    with caplog.at_level(logging.WARNING):
        async with Engine.open(settings, provider=provider) as engine:
            await engine.turn("chat", "before")
            for name in ("heron.db", "heron.db-wal", "heron.db-shm"):  # a backup restored
                (settings.paths.home / name).unlink(missing_ok=True)
            shutil.copy(other, settings.paths.db)
            await engine.turn("chat", "after")
    assert "was replaced by another file; using that one" in caplog.text
    store = Store(settings.paths.db)
    assert _typed(store, "elsewhere") == [("assistant", "kept")]
    assert _typed(store, "chat") == [("user", "after"), ("assistant", "two")]
    store.close()


async def test_slash_retry_after_a_failed_turn_answers_the_message_where_it_is():
    provider = ScriptedProvider([AuthError("bad key"), _ok("answered")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        failed = await engine.turn("chat", "hello there")
        retried = await engine.turn("chat", "/retry")
        rows = _typed(engine.store, "chat")
        turns = engine.store.turns(engine.store.conversation("chat").id)
    assert failed.reply is not None and "send /retry to answer it again" in failed.reply
    assert "(it is not stored twice)" in failed.reply
    assert retried.ok and retried.text == "answered"
    assert rows == [("user", "hello there"), ("assistant", "answered")]
    assert [t.status for t in turns] == ["failed", "done"]
    assert turns[0].user_message_id == turns[1].user_message_id
    # The model saw the message once in the retried request.
    said = [m.text for m in provider.requests[-1].messages if m.role == "user"]
    assert len(said) == 1 and said[0].startswith("hello there")


async def test_slash_retry_of_an_answered_message_starts_a_new_branch():
    provider = ScriptedProvider([_ok("first"), _ok("again")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("chat", "hi")
        await engine.turn("chat", "/retry")
        rows = _typed(engine.store, "chat")
        conversation = engine.store.conversation("chat")
        every = engine.store.all_messages(conversation.id)
    assert rows == [("user", "hi"), ("assistant", "again")]
    assert [m.message.text for m in every] == ["hi", "first", "hi", "again"]  # the old branch


async def test_a_damaged_compaction_or_message_time_is_read_around_never_a_crash(caplog):
    """A compaction whose meta is not JSON made every later turn of its conversation fail
    (and --retry with it); a message time that is not a number crashed export, search and
    recall. Both are read around: the compaction without its meta (named in the log), the
    time as 0, and everything else goes on."""
    from heron.channels.export import exported
    from heron.memory.recall import Recall
    from heron.store import compactions as folds

    settings = Settings.load()
    provider = ScriptedProvider([_ok("zebra answer"), _ok("still here")])
    with caplog.at_level(logging.WARNING):
        async with Engine.open(settings, provider=provider) as engine:
            store = engine.store
            await engine.turn("work", "tell me about the zebra")
            conv = store.conversation("work")
            rows = store.branch(conv.id)
            fold = folds.add_compaction(
                store,
                conv.id,
                kind="consolidation",
                reason="test",
                summary="S",
                first_row_id=rows[0].id,
                last_row_id=rows[-1].id,
                meta={"facts": "f"},
            )
            store.conn.execute("UPDATE compactions SET meta = '{broken' WHERE id = ?", (fold,))
            store.conn.commit()
            later = await engine.turn("work", "are you there?")
            [found] = folds.compactions(store, conv.id)
    store = Store(settings.paths.db)  # a reader of its own, as `heron conversations export`
    store.conn.execute("UPDATE messages SET created = 'yesterday' WHERE id = ?", (rows[0].id,))
    store.conn.commit()
    text, _ = exported(store, "work", "markdown", "UTC")
    hits = Recall(store).search("zebra")
    assert later.ok and later.text == "still here"
    assert found.meta == {} and found.summary == "S"
    assert "tell me about the zebra" in text
    assert {h.message_id: h.created for h in hits}[rows[0].id] == 0.0  # shown, dated 0
    assert f"compaction #{fold}" in caplog.text


async def test_a_damaged_epoch_is_named_and_set_right_never_a_crash(caplog):
    """qa21s #7: `conversations.epoch` holding 'abc' (written outside Heron) failed every turn
    of its conversation with a traceback and `invalid literal for int()`. The next turn's
    claim names the row and sets it to a number no running turn holds."""
    provider = ScriptedProvider([_ok("first"), _ok("second")])
    with caplog.at_level(logging.WARNING):
        async with Engine.open(Settings.load(), provider=provider) as engine:
            await engine.turn("w", "hello")
            conversation = engine.store.conversation("w")
            engine.store.conn.execute(
                "UPDATE conversations SET epoch = 'abc' WHERE id = ?", (conversation.id,)
            )
            engine.store.conn.commit()
            later = await engine.turn("w", "again")
    assert later.ok and later.text == "second"
    said = caplog.text
    assert f"conversation 'w' (row {conversation.id} of conversations)" in said
    assert "'abc'" in said and "set to 1" in said
