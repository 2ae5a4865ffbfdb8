"""Recall's small noise (QA22x L11, QA22t Low 7): a reply said again and again ("ok") that holds
none of the query's words is no hit; a message next to two branches of the same text takes a
neighbour's share once, not once per branch; a clock time or a day of the month states a time."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heron.memory.recall import _WORD, NEIGHBOUR_SHARE, Recall, _lent, same_text
from heron.messages import Message, Text, assistant, user
from heron.serve.api import _search
from heron.store import Store

FACTS = [
    "I booked the dentist for the 14th with Dr. Okonkwo.",
    "We agreed to call it the purple elephant protocol from now on.",
    "The roof leak was fixed by a roofer named Tadeusz.",
]


@pytest.fixture
def store(db: str | Path):  # once per backend (tests/pg.py)
    s = Store(db)
    yield s
    s.close()


def _acknowledged(store: Store) -> dict[str, int]:
    """A long conversation whose every message the assistant answers "ok", the facts among
    chatter, and one fact in another conversation answered "ok" too."""
    c = store.open_conversation("long")
    ids = {}
    for n in range(12):
        text = FACTS[n // 4] if n % 4 == 1 else f"Turn {n}: some chatter about the garden"
        ids[text] = store.append(c.id, user(text)).id
        store.append(c.id, assistant("ok"))
    other = store.open_conversation("other")
    ids["passport"] = store.append(other.id, user("My passport appointment is on Friday")).id
    store.append(other.id, assistant("ok"))
    return ids


@pytest.mark.parametrize("query", ["dentist", "purple elephant protocol", "roof leak fixed"])
def test_a_reply_said_again_that_holds_no_word_of_the_query_is_no_hit(store, query):
    ids = _acknowledged(store)
    hits = Recall(store).search(query, 10)
    assert [h.snippet for h in hits if h.snippet == "ok"] == [], [h.line() for h in hits]
    assert hits[0].message_id == ids[next(f for f in FACTS if query.split()[0] in f)]


def test_a_text_said_again_that_holds_the_querys_words_is_still_one_hit(store):
    c = store.open_conversation("c")
    for _ in range(3):
        store.append(c.id, user("what about the dentist?"))
        store.append(c.id, assistant("ok"))
    [hit] = Recall(store).search("dentist", 10)
    assert hit.times == 3 and "asked 3 times" in hit.line()


def _branched(store: Store) -> dict[str, int]:
    """ "branch first", its echoed answer, then "branch second" sent twice as two branches
    after that answer (an edit), each echoed: the web UI's tester's conversation."""
    c = store.open_conversation("web")
    first = store.append(c.id, user("branch first")).id
    tail = "\n\n[Runtime context: metadata only, not instructions]\nTime: 2026-12-05 23:24"
    echo = store.append(c.id, assistant("echo(58): branch first" + tail)).id
    ids = {"first": first, "echo": echo}
    for n in (63, 68):
        asked = store.append(c.id, Message("user", [Text("branch second")]), parent_id=echo)
        ids[f"second {n}"] = asked.id
        ids[f"echo {n}"] = store.append(c.id, assistant(f"echo({n}): branch second" + tail)).id
    return ids


def test_a_message_before_two_branches_takes_one_neighbours_share(store):
    """A message reads next to one message after it on any branch: two branches of the same
    text after it lent it their share twice, which put a message holding one of the query's
    two words above those that hold both."""
    ids = _branched(store)
    hits = Recall(store).search("branch second", 5)
    assert "branch second" in hits[0].snippet, [h.line() for h in hits]
    assert hits[0].message_id in {ids["second 63"], ids["second 68"]}


def test_the_web_searchs_snippet_holds_the_querys_words(store):
    _branched(store)
    [row] = _search(store, "branch second", 10, 0, "UTC")[0]
    assert "branch second" in row["snippet"], row


@pytest.mark.parametrize(
    "stated",
    [
        "the dentist appointment with Dr. Okonkwo is booked for the 14th",
        "the dentist appointment with Dr. Okonkwo is booked for 9:30",
        "the dentist appointment with Dr. Okonkwo is booked for 9am",
    ],
)
def test_a_clock_time_or_a_day_of_the_month_states_a_time(store, stated):
    c = store.open_conversation("c")
    plain = store.append(c.id, user("the dentist appointment with Dr. Okonkwo is booked")).id
    told = store.append(c.id, user(stated)).id
    recall = Recall(store)
    assert recall.search("dentist appointment Okonkwo")[0].message_id == plain  # BM25's pick
    assert recall.search("When is the dentist appointment with Okonkwo?")[0].message_id == told


# Letters, digits, ASCII punctuation and spacing, and a few non-ASCII letters and marks (one
# makes a text take the pattern's path).
_FOLDABLE = st.text(
    alphabet=st.sampled_from([*"aZ09_ -.,'!?\t\n", "é", "ß", "İ", "\u00a0", "ſ", "日"]),
    max_size=40,
)


@given(text=_FOLDABLE)
def test_two_texts_are_the_same_text_by_their_words_alone(text: str) -> None:
    """`same_text`'s fast path for ASCII gives what its pattern gives (its lowercased words)."""
    assert same_text(text) == " ".join(_WORD.findall(text.lower()))


@given(
    scores=st.dictionaries(st.integers(1, 30), st.floats(0, 50), max_size=12),
    links=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), max_size=20),
)
def test_each_message_is_lent_its_best_neighbour_before_and_after_it(scores, links) -> None:
    near: dict[int, set[int]] = {}
    for a, b in links:
        if a != b:
            near.setdefault(a, set()).add(b)
            near.setdefault(b, set()).add(a)
    expected = dict(scores)
    for item, others in near.items():
        for side in ([o for o in others if o < item], [o for o in others if o > item]):
            lenders = [scores[o] for o in side if o in scores]
            if lenders:
                expected[item] = expected.get(item, 0.0) + NEIGHBOUR_SHARE * max(lenders)
    assert _lent(scores, near) == expected
