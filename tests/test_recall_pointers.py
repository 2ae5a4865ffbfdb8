"""Recall over pointers: once a long conversation folds its older user messages into pointers
("[#123] first words…"), recall_history opens each one whole by its id, and a search for its
exact words puts it first, ahead of messages that share most of those words."""

from __future__ import annotations

import re
from pathlib import Path

from compaction_helpers import Model, all_text

from heron.agent.engine import Engine
from heron.config import Settings
from heron.memory.recall import Recall
from heron.messages import user
from heron.providers.scripted import ScriptedProvider
from heron.tools.context import TurnServices
from heron.tools.memory_tools import recall_history
from heron.tools.registry import ToolContext


def _said(i: int) -> str:
    # Every message shares most words with the others: only the order and a number differ.
    return f"note {i}: the spare key for the shed is with the neighbour at number {i * 7919}"


async def test_pointed_at_messages_open_whole_and_their_exact_words_rank_them_first(
    monkeypatch, home_db
):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "6000")
    model = Model(tool_rounds=2)  # each turn reads big.txt twice: consolidations come soon
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        line = "the quick brown fox jumps over the lazy dog " * 2
        (engine.settings.paths.workspace / "big.txt").write_text((line + "\n") * 230)
        said = [_said(i) for i in range(60)]
        for text in said:
            await engine.turn("k", text)
        store = engine.store
        conv = store.conversation("k")
        by_id = {r.id: r.message.text for r in store.all_messages(conv.id) if r.role == "user"}
        seen = all_text(model.turn_requests[-1])
        pointed = [int(n) for n in re.findall(r"\[#(\d+)\] note \d+", seen)]
        pointed = [n for n in pointed if by_id.get(n) in said and by_id[n] not in seen]
        assert pointed, "the conversation should have folded some messages into pointers"
        # and the ids of a range of older ones, not listed one by one
        low, high = map(int, re.findall(r"\[#(\d+)–#(\d+)\] \d+ older messages", seen)[0])
        pointed += [n for n in sorted(by_id) if low <= n <= high and by_id[n] in said][:3]
        # As a tool of the conversation: what its view shows whole is left out of a search,
        # and a pointer is not the message.
        services = TurnServices(recall=Recall(store), conversation_id=conv.id)
        ctx = ToolContext(workspace=Path("."), services=services)
        for row_id in pointed:
            whole = by_id[row_id]
            opened = recall_history.fn(ctx, message_id=row_id)
            assert f"· message {row_id} · user]" in opened.splitlines()[0] and whole in opened
            found = recall_history.fn(ctx, query=whole, limit=5).splitlines()
            assert f"· message {row_id} · user]" in found[0], (row_id, found[:2])


def test_exact_words_beat_a_message_that_repeats_the_rarer_ones(db: str | Path):
    """BM25 (or ts_rank) alone ranks the message that repeats the query's rare words higher;
    the verbatim one still comes first. Two words say too little to be a quote: ranking as
    usual."""
    from heron.store import Store

    store = Store(db)
    conv = store.open_conversation("c")
    store.append(conv.id, user("orbi router orbi router orbi router in the garage loft"))
    exact = store.append(conv.id, user("is the orbi router in the garage?"))
    recall = Recall(store)
    assert recall.bm25("the orbi router in the garage", 2)[0][0] != exact.id
    assert recall.search("the orbi router in the garage", 2)[0].message_id == exact.id
    assert recall.verbatim("orbi router") == []
    store.close()
