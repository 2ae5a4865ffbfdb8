"""Slash commands (exact output), the turn's state machine, failure recovery, delete refusal."""

from __future__ import annotations

import asyncio
import os

import pytest

from heron.agent import commands
from heron.agent.engine import Engine
from heron.agent.leases import hold_lease, presence
from heron.agent.turn import FAILED, TRANSITIONS, Outcome, State
from heron.channels.info import delete_conversation
from heron.config import Settings
from heron.errors import AuthError, ContextOverflow, StoreError
from heron.memory.extract import FACTS_SYSTEM
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest


def _first(message) -> str:
    """What was typed, without the runtime block appended after it."""
    return message.parts[0].text


def _texts(request) -> list[str]:
    return [_first(m) for m in request.messages]


def test_transition_table_is_a_single_path_with_two_exits():
    assert TRANSITIONS[State.COMMAND] == {State.BUILD, State.RESPOND}
    assert TRANSITIONS[State.RUN] == {State.SAVE, State.RUN}
    reachable, todo = set(), [State.RESTORE]
    while todo:
        s = todo.pop()
        if s not in reachable:
            reachable.add(s)
            todo.extend(TRANSITIONS[s])
    assert reachable == set(State)


async def test_plain_turn_walks_every_state_and_delivers():
    provider = ScriptedProvider([Reply([Text("hi")], "done", Usage(100, 5))])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("k", "hello")
    assert result.states == [
        "RESTORE",
        "COMMAND",
        "BUILD",
        "RUN",
        "SAVE",
        "RESPOND",
        "DONE",
    ]
    assert result.outcome is Outcome.DELIVERED and result.reply == "hi"


async def test_help_and_unknown_slash_text():
    provider = ScriptedProvider([Reply([Text("no such command, but hi")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        helped = await engine.turn("k", "/help")
        unknown = await engine.turn("k", "/foo bar")
    assert helped.reply == commands.HELP and helped.command == "help"
    # how to use a real model is for a newcomer on the offline demo only
    assert "set ANTHROPIC_API_KEY" not in helped.reply
    assert "set ANTHROPIC_API_KEY, OPENAI_API_KEY or HERON_BASE_URL" in commands.help_text(True)
    assert len(provider.requests) == 1 and _first(provider.requests[0].messages[-1]) == "/foo bar"
    assert unknown.command is None and unknown.reply == "no such command, but hi"


async def test_commands_on_a_new_key_store_no_conversation():
    provider = ScriptedProvider([Reply([Text("hi")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        for text in ("/status", "/retry", "/help", "/new", "/tree"):
            result = await engine.turn("fresh", text)
            assert result.command is not None, text
            assert engine.store.conversation("fresh") is None, text
        await engine.turn("used", "hello")
        await engine.turn("used", "/status")  # a command in a conversation that has words
        engine.store.open_conversation("open")  # a chat holds it open: not dropped under it
        async with presence(engine.store, engine.store.conversation("open").id):
            await engine.turn("open", "/status")
            assert engine.store.conversation("open") is not None
        assert [c.key for c in engine.store.conversations()] == ["used"]


async def test_a_chat_left_without_a_message_leaves_no_conversation():
    from contextlib import AsyncExitStack

    from heron.channels.terminal import _present

    async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
        async with AsyncExitStack() as held:
            await _present(engine, "brandnew", held)
            assert engine.store.conversation("brandnew") is not None  # open while the chat is
        assert engine.store.conversation("brandnew") is None


async def test_status_counts_one_turn_in_the_singular(capsys):
    """ "(1 turns)" in /status (and the CLI, the trace, the browser): one turn is "1 turn"."""
    from heron.messages import plural

    assert [plural(n, "turn") for n in (0, 1, 2, 1000)] == [
        "0 turns",
        "1 turn",
        "2 turns",
        "1,000 turns",
    ]
    provider = ScriptedProvider([Reply([Text("a")], "done", Usage(1000, 50, cache_read=500))])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("s", "one")
        status = await engine.turn("s", "/status")
    assert "conversation: s (1 turn)\n" in (status.reply or "")
    assert "over the last 1 turn\n" in (status.reply or "")
    from heron.channels.info import show_conversation

    show_conversation(Settings.load(), "s")
    shown = capsys.readouterr().out
    assert "Conversation s · agent default · 1 turn\n" in shown
    assert "· 1 model call, 0 tool calls ·" in shown


async def test_status_exact_output():
    provider = ScriptedProvider(
        [
            Reply([Text("a")], "done", Usage(1000, 50)),
            Reply([Text("b")], "done", Usage(1200, 30, cache_read=900)),
        ]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        empty = await engine.turn("s", "/status")
        await engine.turn("s", "one")
        await engine.turn("s", "two")
        status = await engine.turn("s", "/status")
    window = engine.choice.profile.context_window
    budget = (
        "budget (tokens, share of the window):\n"
        f"  window                             {window:>9,}\n"
        "  output reserve                         8,192 (6.4%)\n"
        "  system prompt with memory             38,400 (30.0%)\n"
        "    memory                              10,240 (8.0%)\n"
        "  archived context                      10,240 (8.0%)\n"
        "    the user's verbatim words in it      3,840 (3.0%)\n"
        "  recent turns kept whole                6,400 (5.0%)\n"
        "  one tool result                        3,200 (2.5%)\n"
        "  one recall result                      3,840 (3.0%)\n"
        "  one user message                      32,000 (25.0%)\n"
    )
    assert empty.reply == (
        "model: scripted/scripted\nconversation: s (0 turns)\n"
        f"context: 0 tokens (0.0% of {window:,})\n{budget}"
        "cache hit rate: no model calls yet\nturn: idle"
    )
    assert status.reply == (
        "model: scripted/scripted\nconversation: s (2 turns)\n"
        f"context: 1,230 tokens ({100 * 1230 / window:.1f}% of {window:,})\n{budget}"
        "cache hit rate: 41% over the last 2 turns\nturn: idle"
    )


async def test_status_and_stop_see_a_turn_held_by_another_session():
    async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
        conv = engine.store.open_conversation("busy")
        async with hold_lease(engine.store, conv.id):
            status = await asyncio.wait_for(engine.turn("busy", "/status"), 2)
            stop = await asyncio.wait_for(engine.turn("busy", "/stop"), 2)
        epoch = engine.store.conversation("busy").epoch
        idle_stop = await engine.turn("busy", "/stop")
    assert status.reply.endswith(f"turn: running (a turn in process {os.getpid()})")
    assert stop.reply.startswith("Stopped a turn in process") and epoch == 1
    assert idle_stop.reply == "Nothing is running."


async def test_new_keeps_the_transcript_and_the_model_starts_fresh():
    answers = [Reply([Text("first")], "done"), Reply([Text("fresh")], "done")]
    passes: list[ChatRequest] = []

    def model(request: ChatRequest) -> Reply:
        if request.system == FACTS_SYSTEM:  # /new's background memory pass
            passes.append(request)
            return Reply([Text('{"facts": []}')], "done")
        return answers.pop(0)

    provider = ScriptedProvider(model)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("n", "remember the cake")
        new = await engine.turn("n", "/new")
        await engine.settle_background()
        await engine.turn("n", "what cake?")
        conv = engine.store.conversation("n")
        rows = engine.store.branch(conv.id)
    # /new archived the tail for memory: the extraction pass read what was said before it.
    assert len(passes) == 1 and "remember the cake" in " ".join(_texts(passes[0]))
    assert new.reply == (
        "New conversation started. The transcript above is kept; the model no longer sees it."
    )
    assert [r.message.text for r in rows] == [
        "remember the cake",
        "first",
        commands.SEPARATOR,
        "what cake?",
        "fresh",
    ]
    assert conv.epoch == 1
    turn_requests = [r for r in provider.requests if r.system != FACTS_SYSTEM]
    assert "remember the cake" not in " ".join(_texts(turn_requests[1]))


async def test_retry_right_after_new_does_not_bring_back_what_new_dropped():
    """/retry after /new moved the head back before the separator and sent the model the old
    conversation again, undoing the /new without a word (QA22u M3)."""
    from heron.bus import NOTHING_SINCE_NEW

    def model(request: ChatRequest) -> Reply:
        if request.system == FACTS_SYSTEM:  # /new's background memory pass
            return Reply([Text('{"facts": []}')], "done")
        return Reply([Text(f"answer {len(_texts(request))}")], "done")

    provider = ScriptedProvider(model)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("nr", "my secret project is Bluebird")
        await engine.turn("nr", "/new")
        retried = await engine.turn("nr", "/retry")
        conv = engine.store.conversation("nr")
        branch = [r.message.text for r in engine.store.branch(conv.id)]
        await engine.turn("nr", "hello again")
        again = await engine.turn("nr", "/retry")  # a message since /new is retried as ever
        await engine.settle_background()
    assert retried.reply == NOTHING_SINCE_NEW
    assert branch == ["my secret project is Bluebird", "answer 1", commands.SEPARATOR]
    turns = [_texts(r) for r in provider.requests if r.system != FACTS_SYSTEM]
    assert turns[1:] == [["hello again"], ["hello again"]]
    assert again.reply == "answer 1"


async def test_retry_and_edit_branch_and_keep_the_replaced_answers():
    provider = ScriptedProvider(
        [
            Reply([Text("answer 1")], "done"),
            Reply([Text("answer 1b")], "done"),
            Reply([Text("answer edited")], "done"),
            Reply([Text("more on 1")], "done"),
            Reply([Text("more again")], "done"),
        ]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("r", "question")
        retried = await engine.turn("r", "/retry")
        edited = await engine.turn("r", "/edit 1 better question")
        tree = await engine.turn("r", "/tree")
        switched = await engine.turn("r", "/tree 1")
        conv = engine.store.conversation("r")
        branch = [r.message.text for r in engine.store.branch(conv.id)]
        everything = [r.message.text for r in engine.store.all_messages(conv.id)]
        await engine.turn("r", "and then?")  # branch 1 grows: it keeps its number
        grown = await engine.turn("r", "/tree")
        await engine.turn("r", "/retry")  # of the branch's second message
        again = await engine.turn("r", "/tree")
    # a branch /retry or /edit made says which of your messages it redoes (by /edit's number)
    assert "* 1. and then? → more on 1\n  2. question → answer 1b (retry of message 1)\n" in (
        grown.reply
    )
    assert ". and then? → more again (retry of message 2)\n" in again.reply
    assert retried.reply == "answer 1b" and edited.reply == "answer edited"
    assert _texts(provider.requests[1]) == ["question"]
    assert _texts(provider.requests[2]) == ["better question"]
    assert everything == [
        "question",
        "answer 1",
        "question",
        "answer 1b",
        "better question",
        "answer edited",
    ]
    assert tree.reply == (
        "Branches of r (* current; /tree N switches, /edit N TEXT rewinds):\n"
        "  1. question → answer 1\n  2. question → answer 1b (retry of message 1)\n"
        "* 3. better question → answer edited (edit of message 1: “question”)\n"
        "Your messages on the current branch:\n  1. better question"
    )
    assert switched.reply == "Switched to branch 1: question → answer 1"
    assert branch == ["question", "answer 1"]


async def test_resume_lists_and_switches():
    long = " ".join(f"word{i}" for i in range(100))
    replies = [Reply([Text(long)], "done"), Reply([Text("ok")], "done")]
    async with Engine.open(Settings.load(), provider=ScriptedProvider(replies)) as engine:
        await engine.turn("older", "hello\nthere")
        await engine.turn("current", "hello")
        listed = await engine.turn("current", "/resume")
        picked = await engine.turn("current", "/resume older")
        missing = await engine.turn("current", "/resume nope")
        await engine.store.call(engine.store.open_conversation, "empty")
        silent = await engine.turn("current", "/resume empty")
    assert (
        listed.reply.splitlines()[0] == "Conversations (newest first); /resume KEY continues one:"
    )
    assert {"  older  hello", "  current  hello"} <= set(listed.reply.splitlines()[1:])
    # where the conversation was, short (it landed on an empty prompt)
    assert picked.switch_to == "older"
    assert picked.reply == (
        "Resumed older; where it was:\n  you › hello there\n"
        f"  heron › {' '.join(long.split())[: commands.RECAP_CHARS - 1]}…"
    )
    assert silent.reply == "Resumed empty." and silent.switch_to == "empty"
    assert missing.reply == "No conversation 'nope'. /resume lists them."


async def test_compact_calls_compaction_with_a_run_to_record_in(monkeypatch):
    import heron.compaction
    from heron.compaction.consolidate import CompactionReport

    async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
        calls = []

        async def fake_compact(engine, conversation, *, reason="manual", on_call=None, **_):
            calls.append((conversation.key, reason, on_call is not None))
            return CompactionReport("consolidation", reason, rows_folded=12)

        monkeypatch.setattr(heron.compaction, "compact_conversation", fake_compact)
        result = await engine.turn("c", "/compact")
    assert result.reply.startswith("Compacted 12 messages") and calls == [("c", "manual", True)]


async def test_context_overflow_shrinks_the_window_compacts_and_retries(monkeypatch):
    import heron.agent.turn
    from heron.compaction.consolidate import CompactionReport

    provider = ScriptedProvider(
        [
            ContextOverflow("prompt too long", status=400),
            Reply([Text("fits now")], "done"),
        ]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        windows = []

        async def fake_compact(engine, conversation, *, reason="manual", window=None, **_):
            windows.append((reason, window))
            return CompactionReport("none", reason)

        monkeypatch.setattr(heron.agent.turn, "compact_conversation", fake_compact)
        result = await engine.turn("o", "big question")
    assert result.reply == "fits now" and result.states.count("RUN") == 2
    # No window stated: compacted for a quarter less than the one that overflowed (the
    # summary's request goes to the same server).
    assert windows == [("overflow", int(engine.choice.profile.context_window * 0.75))]


async def test_failed_turn_ends_with_a_clear_message_and_keeps_the_users_message():
    provider = ScriptedProvider([AuthError("401 bad key", hint="Set ANTHROPIC_API_KEY")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("f", "keep me")
        rows = engine.store.branch(engine.store.conversation("f").id)
    assert result.reply == FAILED.format(error=result.run.error)
    assert result.reply.startswith("The turn failed: 401 bad key\nSet ANTHROPIC_API_KEY")
    assert [r.message.text for r in rows] == ["keep me"]


async def test_delete_refuses_while_a_turn_runs_or_another_chat_is_open(capsys):
    settings = Settings.load()
    async with Engine.open(settings, provider=ScriptedProvider([])) as engine:
        conv = engine.store.open_conversation("used")
        async with hold_lease(engine.store, conv.id):
            with pytest.raises(StoreError, match="a turn in process"):
                await asyncio.to_thread(delete_conversation, settings, "used")
        async with presence(engine.store, conv.id, "an open chat"):
            with pytest.raises(StoreError, match="an open chat in process"):
                await asyncio.to_thread(delete_conversation, settings, "used")
        await asyncio.to_thread(delete_conversation, settings, "used")
    assert "Deleted conversation 'used'." in capsys.readouterr().out


async def test_tree_lists_what_the_person_typed_without_mail_labels():
    """Follow-ups typed while a turn worked are stored with a label for the model; /tree is
    read by the person, who typed no label."""
    from heron.agent.control import mail_label

    provider = ScriptedProvider([Reply([Text("ok")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("m", mail_label("terminal") + "followup from the terminal")
        tree = await engine.turn("m", "/tree")
    assert "1. followup from the terminal" in tree.reply
    assert "sent while you were working" not in tree.reply
