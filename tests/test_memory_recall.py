"""Recall over history, on both backends: the full-text index kept in step with the messages
(FTS5's triggers, PostgreSQL's generated tsvector), ranking, snippets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from heron.memory.recall import Cue, Recall, blend, match_expression, query_cue, speaker_of, terms
from heron.messages import Message, ToolCall, ToolResult, assistant, user
from heron.store import Store


@pytest.fixture
def store(db: str | Path):  # once per backend (tests/pg.py)
    s = Store(db)
    yield s
    s.close()


def test_every_message_is_indexed_and_kept_in_sync(store):
    a = store.open_conversation("a")
    first = store.append(a.id, user("We adopted a greyhound named Biscuit"))
    store.append(a.id, Message("assistant", [ToolCall("t", "x", {})]))  # no text: not indexed
    store.append(a.id, Message("user", [ToolResult("t", "greyhound facts from a web page")]))
    compacted = store.append(a.id, assistant("Biscuit sounds lovely"))
    store.update_meta(compacted.id, {"compacted": True})  # compaction marks, never deletes
    recall = Recall(store)
    assert [h.message_id for h in recall.search("greyhound")] == [first.id]
    assert {h.message_id for h in recall.search("Biscuit")} == {first.id, compacted.id}
    store.conn.execute(
        "UPDATE messages SET parts = ? WHERE id = ?",
        ('[{"kind":"text","text":"a cat named Tom"}]', first.id),
    )
    assert [h.message_id for h in recall.search("cat")] == [first.id]
    store.delete_conversation(a.id)
    assert recall.search("Biscuit") == []


def test_search_returns_conversation_date_and_id_across_conversations(store):
    old = store.open_conversation("trip-planning")
    store.append(old.id, user("My passport expires in March 2027"))
    store.append(old.id, assistant("Good to know."))
    new = store.open_conversation("today")
    store.append(new.id, user("hello"))
    [hit, *_] = Recall(store).search("When does my passport expire?")
    assert hit.conversation_key == "trip-planning" and hit.message_id == 1
    assert "passport" in hit.line() and "trip-planning" in hit.line()
    assert Recall(store).search("passport", conversation_id=new.id) == []


def test_queries_are_never_read_as_fts_syntax(store):
    c = store.open_conversation("c")
    store.append(c.id, user('He said "NEAR" AND OR NOT * ^ ( foo'))
    for query in ['"', "AND OR NOT", "foo*", "(", "col:foo", "^", "NEAR(a b)", ""]:
        Recall(store).search(query)  # no sqlite3.OperationalError
    assert match_expression("the a of") is None
    assert terms("What did Caroline's sister research?") == ["caroline", "sister", "research"]


def test_a_query_is_read_for_the_time_and_the_people_it_asks_about() -> None:
    none: frozenset[str] = frozenset()
    assert query_cue("When did Melanie go camping in June?") == Cue(
        True, frozenset({6}), frozenset(), frozenset({"melanie"})
    )
    assert query_cue("What did Gina find on 1 February, 2023?") == Cue(
        False, frozenset({2}), frozenset({2023}), frozenset({"gina"})
    )
    assert query_cue("how long ago was her 18th birthday") == Cue(True, none, none, none)
    assert query_cue("What happened in May?") == Cue(False, frozenset({5}), none, none)
    assert query_cue("may I ask about the pottery class") is None  # the verb, not the month
    assert query_cue("what did we research") is None
    assert speaker_of("Caroline: I went to a support group") == "Caroline"
    assert speaker_of("Mary Ann: yes") == "Mary Ann"
    assert speaker_of("note: buy milk") is None and speaker_of("I said: hi") is None


def _dated(store: Store, cid: int, text: str, when: str) -> int:
    message = store.append(cid, user(text))
    created = time.mktime(time.strptime(when, "%Y-%m-%d"))
    store.conn.execute("UPDATE messages SET created = ? WHERE id = ?", (created, message.id))
    return message.id


def test_a_question_about_time_ranks_what_can_answer_it_first(store):
    """Two messages hold the question's words alike: for "when", the one that states a time
    comes first; for a month, the one written in that month."""
    c = store.open_conversation("c")
    plain = _dated(store, c.id, "we went camping at the lake", "2023-07-20")
    stated = _dated(store, c.id, "we went camping at the lake last weekend", "2023-06-10")
    recall = Recall(store)
    assert recall.search("camping at the lake")[0].message_id == plain  # shorter: BM25's pick
    assert recall.search("When did we go camping at the lake?")[0].message_id == stated
    assert recall.search("camping at the lake in July")[0].message_id == plain
    assert recall.search("camping at the lake in June 2023")[0].message_id == stated


def test_a_question_naming_a_person_ranks_their_own_lines_first(store):
    c = store.open_conversation("c")
    told = store.append(c.id, user("Melanie: Caroline went to the pottery class with her kids"))
    said = store.append(c.id, user("Caroline: I went to the pottery class on my own today"))
    recall = Recall(store)
    assert recall.search("the pottery class kids")[0].message_id == told.id
    [first, *_] = recall.search("What pottery class did Caroline go to with kids?")
    assert first.message_id == said.id


def test_blend_prefers_what_both_rankings_hold():
    lexical = {1: 9.0, 2: 8.0}
    semantic = {1: 0.1, 2: 0.8, 3: 0.9}
    assert blend(lexical, semantic, {}, {})[0][0] == 2
    # A clear BM25 winner is not dragged down to a rank-based tie.
    assert blend({1: 30.0, 2: 3.0}, {1: 0.2, 2: 0.5}, {}, {})[0][0] == 1


def test_blend_lends_to_neighbours_and_sessions():
    semantic = {1: 0.5, 2: 0.3, 3: 0.32, 4: 0.0}
    assert blend({}, semantic, {}, {})[1][0] == 3
    # 2 sits next to the strong hit 1: the spreading puts it ahead of 3.
    assert blend({}, semantic, {1: {2}, 2: {1}}, {})[1][0] == 2
    # Or 2 shares a session with strong hits while 3 stands alone.
    days = {1: (1, 5), 2: (1, 5), 3: (1, 6), 4: (1, 6)}
    assert blend({}, semantic, {}, days)[1][0] == 2


class FakeEmbedder:
    name = "fake"

    def encode(self, texts):
        return [
            [1.0, 0.0] if "dog" in t.lower() or "puppy" in t.lower() else [0.0, 1.0] for t in texts
        ]


def test_fused_search_finds_meaning_without_shared_words(store):
    c = store.open_conversation("c")
    pet = store.append(c.id, user("We got a new puppy last week"))
    store.append(c.id, user("The weather was grey"))
    recall = Recall(store, FakeEmbedder())
    assert recall.bm25("dog", 5) == []
    assert recall.search("dog", 1)[0].message_id == pet.id


def test_auto_recall_injects_strong_hits_not_in_view(store):
    from heron.memory.auto import auto_messages

    old = store.open_conversation("old")
    hit = store.append(old.id, user("The wifi router in the garage is a Netgear Orbi RBR50"))
    store.append(old.id, user("unrelated chatter about lunch"))
    here = store.open_conversation("here")
    recall = Recall(store)
    question = "which Netgear Orbi router is in the garage?"
    injected = auto_messages(recall, question, here.id)
    assert injected[0].tool_calls[0].name == "recall_history"
    content = injected[1].tool_results[0].content
    assert f"message {hit.id}" in content
    # another conversation's hit is labelled as such
    assert content.splitlines()[0] == "From other conversations (not this one):"
    assert auto_messages(recall, question, here.id, [hit.id]) == []
    assert auto_messages(recall, "zebra quartz violin", here.id) == []


def test_auto_recall_prefers_this_conversation_and_holds_others_to_a_stricter_bar(store):
    from heron.memory.auto import Gate, auto_hits

    here = store.open_conversation("here")
    mine = store.append(here.id, user("the boat trailer needs new tyres before the lake trip"))
    for i in range(6):
        store.append(here.id, assistant(f"filler {i} about breakfast"))
    other = store.open_conversation("other")
    theirs = store.append(other.id, user("the boat trailer needs new tyres before the lake trip"))
    partial = store.append(other.id, user("the trailer at the lake"))
    recall = Recall(store)
    question = "what does the boat trailer need before the lake trip"
    found = auto_hits(recall, question, here.id, gate=Gate(hits=2))
    # this conversation's hit is enough: the others are searched only when it has none
    assert [(a.hit.message_id, a.other) for a in found] == [(mine.id, False)]
    found = auto_hits(recall, question, here.id, [mine.id], gate=Gate(hits=2))
    assert [(a.hit.message_id, a.other) for a in found] == [(theirs.id, True)]
    # a partial match is enough here, not elsewhere
    strict = auto_hits(recall, "trailer lake", here.id, gate=Gate(own=0.1, other=1.01))
    assert partial.id not in {a.hit.message_id for a in strict}
    loose = auto_hits(recall, "trailer lake", here.id, [mine.id], gate=Gate(other=0.5, hits=3))
    assert partial.id in {a.hit.message_id for a in loose}


def test_auto_recall_fits_its_budget(store):
    from heron.memory.auto import auto_messages

    conv = store.open_conversation("c")
    for i in range(3):
        store.append(
            conv.id, user(f"the garden shed key {i} " + "is under the blue flowerpot " * 12)
        )
    other = store.open_conversation("new")
    found = auto_messages(Recall(store), "where is the garden shed key", other.id, max_chars=500)
    content = found[1].tool_results[0].content
    assert len(content) <= 500 and "· message " in content


class RecordingEmbedder(FakeEmbedder):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def encode(self, texts):
        self.seen.extend(texts)
        return super().encode(texts)


def test_each_message_is_embedded_with_the_one_before(store):
    c = store.open_conversation("c")
    store.append(c.id, user("Did you ever get a dog?"))
    store.append(c.id, assistant("Yes, last Tuesday"))
    store.append(c.id, user("The weather was grey"))
    embedder = RecordingEmbedder()
    recall = Recall(store, embedder)
    assert recall.index_missing() == 3
    assert "Did you ever get a dog?\nYes, last Tuesday" in embedder.seen
    assert recall.index_missing() == 0  # stored: never embedded twice
    # The reply alone says nothing of dogs; with its context it is found by meaning.
    assert dict(recall.semantic("puppy", 3)) == {1: 1.0, 2: 1.0, 3: 0.0}


def test_vectors_held_in_memory_follow_additions_and_deletions(store):
    a, b = store.open_conversation("a"), store.open_conversation("b")
    first = store.append(a.id, user("Our dog is called Rex"))
    recall = Recall(store, FakeEmbedder())
    assert [i for i, _ in recall.semantic("puppy", 1)] == [first.id]
    other = store.append(b.id, user("The puppy from the shelter"))
    assert recall.semantic("puppy", 5, conversation_id=b.id) == [(other.id, 1.0)]
    store.delete_conversation(a.id)
    assert [i for i, _ in recall.semantic("puppy", 5)] == [other.id]
    # A second Recall on the same store sees the same vectors.
    assert [i for i, _ in Recall(store, FakeEmbedder()).semantic("dog", 5)] == [other.id]


def test_a_lift_reads_only_what_can_reach_the_first_results(store):
    """`_lifted` leaves out, before reading their text and dates, the messages too far below
    to be lifted into the first `limit`: the order is that of lifting every one."""
    import random

    from heron.memory import recall as module

    rng = random.Random(3)
    c = store.open_conversation("c")
    words = ["camping", "lake", "yesterday", "kids", "pottery", "last", "week", "beach"]
    ids = [
        _dated(
            store,
            c.id,
            rng.choice(["Ann: ", "Bo: ", ""]) + " ".join(rng.choices(words, k=4)),
            f"2023-{rng.randint(1, 12):02d}-11",
        )
        for _ in range(60)
    ]
    recall = Recall(store)
    bodies = recall.bodies(ids)
    dates = module.records.message_dates(store, ids)
    month = {i: time.localtime(created).tm_mon for i, _, created in dates}
    queries = ["when did we camp", "camping in June", "when, in March?", "what did Ann say"]
    for trial in range(40):
        ranked = sorted(((i, rng.random()) for i in ids), key=lambda kv: (-kv[1], kv[0]))
        cue = query_cue(rng.choice(queries))
        assert cue is not None
        limit = rng.choice([1, 5, 10])
        states = {i for i in ids if module._STATES_TIME.search(bodies[i])}
        lift = {
            i: (module.WHEN_WEIGHT if cue.asks_when and i in states else 0)
            + (module.DATE_WEIGHT if month[i] in cue.months else 0)
            + (module.SPEAKER_WEIGHT if bodies[i].startswith("Ann:") and cue.names else 0)
            for i in ids
        }
        lifted = [(i, s + lift[i] * ranked[0][1]) for i, s in ranked]
        every = sorted(lifted, key=lambda kv: (-kv[1], kv[0]))
        assert recall._lifted(cue, ranked, limit) == every[:limit], trial
