"""The size-normalised auto-recall gate (`gated_hits`): what fires for a question must not
change when the history around it grows with unrelated text."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from strength import examples_on

from heron.memory.auto import gated_hits
from heron.memory.recall import Recall, held_by, held_terms, terms
from heron.messages import Message, Text
from heron.store import Store

LINES = [
    "Caroline: I went to the LGBTQ support group yesterday and it was powerful",
    "Melanie: my kids loved the pottery class we took last weekend",
    "Caroline: I am researching adoption agencies for next year",
    "Melanie: we camped at the beach and watched the meteor shower",
    "Caroline: the support group helped me feel accepted",
]
UNRELATED = ["zebra", "quartz", "violin", "glacier", "tulip", "harbor", "nickel", "orbit"]


def _store(where: str | Path, copies: int) -> tuple[Store, int]:
    store = Store(where)
    conv = store.open_conversation("locomo")
    for line in LINES:
        store.append(conv.id, Message("user", [Text(line)]))
    other = store.open_conversation("elsewhere")
    for n in range(copies * len(LINES)):
        words = " ".join(UNRELATED[(n + k) % len(UNRELATED)] for k in range(6))
        store.append(other.id, Message("user", [Text(words)]))
    return store, conv.id


def test_more_unrelated_history_does_not_change_what_fires(tmp_path, new_db, request) -> None:
    @settings(max_examples=examples_on(request, 15, pg=6), deadline=None)
    @given(copies=st.integers(min_value=1, max_value=40), line=st.sampled_from(LINES))
    def check(copies: int, line: str) -> None:
        question = "what did " + line.split(": ", 1)[1]
        small, cid = _store(new_db(f"gate-{copies}-small"), 0)
        big, big_cid = _store(new_db(f"gate-{copies}"), copies)
        try:
            before = gated_hits(Recall(small), question, cid)
            after = gated_hits(Recall(big), question, big_cid)
            assert before  # the question's own line always fires
            # the same hits, with the same normalised scores: the gate cannot drift with size
            assert after == before
        finally:
            small.close()
            big.close()
            for p in tmp_path.glob("gate-*"):
                p.unlink()

    check()


def test_the_gate_fires_on_the_evidence_and_not_on_a_stranger(db) -> None:
    store, cid = _store(db, 3)
    try:
        recall = Recall(store)
        fired = gated_hits(recall, "what support group is Caroline in?", cid)
        assert fired
        assert "support group" in recall.body(recall._hits(fired, "x")[0])
        assert gated_hits(recall, "zebra quartz violin", cid) == []
        seen = [i for i, _ in fired]
        assert not {i for i, _ in gated_hits(recall, "what support group?", cid, seen)} & set(seen)
    finally:
        store.close()


# Pieces of words that hold one another (a short word inside a longer one, at its start, in
# its middle), letters that lowercase to more than one character (İ) or change with their
# context (Σ), digits, and joins that are word characters (_, or none) or are not.
PIECES = ["ab", "cab", "abc", "abcd", "xabcd", "abcdef", "12", "1", "éab", "İab", "ΣAB", "σab"]
JOINS = [" ", "\n", "-", "_", "", ". "]
texts = st.lists(st.tuples(st.sampled_from(PIECES), st.sampled_from(JOINS)), max_size=6).map(
    lambda parts: "".join(p + j for p, j in parts)
)


@given(bodies=st.lists(texts, max_size=6), query=texts)
def test_held_by_finds_what_held_terms_finds(bodies, query) -> None:
    """The gate's words of every candidate at once are each candidate's `held_terms`: word
    starts, word ends for short words, a word at a body's edge, inside a longer word."""
    words = terms(query)
    assert held_by(bodies, words) == [held_terms(b, words) for b in bodies]


def test_an_answer_passes_with_the_share_of_the_question_it_answers(tmp_path) -> None:
    """The reply to a message that asks, and passes the gate, passes with its share: the
    answer ("5 years already!") holds none of the question's words. A reply to a message that
    does not ask gains nothing, and without `Gate.answers` neither does an answer."""
    from heron.memory.auto import Gate, auto_hits, shares

    store = Store(tmp_path / "answers.db")
    try:
        conv = store.open_conversation("c").id
        lines = [
            "Caroline: How long have you been married?",
            "Melanie: 5 years already!",
            "Caroline: my friend got married a long time ago",
            "Melanie: lovely news",
            *(f"note {n} about the garden" for n in range(6)),
        ]
        ids = [store.append(conv, Message("user", [Text(line)])).id for line in lines]
        asked, answer, said = ids[:3]
        question = "How long has Melanie been married?"
        share = shares(Recall(store), question, conv)
        assert set(share) == {asked, said}  # each holds two of the question's words
        every = Gate(hits=10, depth=10, second=0.0)  # whatever passes, in any order
        found = {
            h.hit.message_id: h.share for h in auto_hits(Recall(store), question, conv, gate=every)
        }
        # "lovely news" (ids[3]) answers `said`, which does not ask: it stays out
        assert found == {asked: share[asked], answer: share[asked], said: share[said]}
        plain = Gate(hits=10, depth=10, second=0.0, answers=False)
        found = {h.hit.message_id for h in auto_hits(Recall(store), question, conv, gate=plain)}
        assert found == {asked, said}
    finally:
        store.close()
