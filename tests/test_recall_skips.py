"""Auto-recall skips the searches that cannot fire (issue 17, the step's cost), with the same
hits as the full computation:

- the other conversations' search, when the query's words found in them cannot carry the
  share their bar needs (`auto.most_share`, `Recall.found_elsewhere`);
- the conversation's own search, when every message of it that could be shown is in view or
  was written before /new (`wiring.unseen_own`).

Each is checked against the computation without the skip on random histories: words said in
one conversation only, words whose stem the index and the gate's word test read apart ("happy"
in "happyness"), edits that leave messages off the branch, /new floors and folds."""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strength import examples_on

from heron.memory import auto, wiring
from heron.memory.auto import CANDIDATES, GATE, auto_hits, fires, most_share, shares
from heron.memory.recall import Recall
from heron.memory.section import set_history_floor
from heron.messages import Message, Text
from heron.store import Store
from heron.store import compactions as folds

NewDb = Callable[[str], "str | Path"]  # tests/pg.py's new_db: a fresh database per name

SHARED = ["garden", "pottery", "camping", "beach", "support", "group", "message", "3", "7"]
# Each conversation n also says words of its own: "c<n>", "topic<n>"; the stems below are
# read apart by FTS5's porter stemmer and the gate's prefix test ("happy"* does not match
# "happyness", whose stem is "happy", where the query's is "happi").
STEMS = ["happy", "happyness", "photo", "photography", "relat", "relational"]


def _words(rng: random.Random, n: int) -> list[str]:
    own = [f"c{n}", f"topic{n}", STEMS[n % len(STEMS)]]
    return rng.choices(SHARED + own + own, k=rng.randint(2, 7))


def _line(rng: random.Random, n: int) -> str:
    """A line of conversation n; some ask (their replies then pass with their share)."""
    return " ".join(_words(rng, n)) + ("?" if rng.random() < 0.3 else "")


_NAMES = itertools.count()  # each history in a database of its own (hypothesis repeats seeds)


def _history(new_db: NewDb, seed: int, conversations: int = 4) -> tuple[Store, list[int]]:
    """Conversations of random lines over shared words, words of their own and the stems."""
    rng = random.Random(seed)
    store = Store(new_db(f"skips-{next(_NAMES)}"))
    convs = [store.open_conversation(f"k{n}").id for n in range(conversations)]
    for _ in range(rng.randint(20, 80)):
        n = rng.randrange(conversations)
        store.append(convs[n], Message("user", [Text(_line(rng, n))]))
    return store, convs


def _queries(rng: random.Random, n: int) -> list[str]:
    return [" ".join(_words(rng, n)) for _ in range(6)] + ["c0 message 3", "happy photo c1"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    held=st.integers(min_value=0, max_value=8),
    unheld=st.integers(min_value=0, max_value=6),
    candidates=st.integers(min_value=1, max_value=CANDIDATES),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_no_share_exceeds_the_bound(held, unheld, candidates, seed) -> None:
    """The share as `auto.shares` counts it, over any candidates that hold only `held` of the
    query's words, never exceeds `most_share(held, held + unheld)`: the extremes included (one
    candidate holding all of them, every candidate holding all of them)."""
    rng = random.Random(seed)
    words = held + unheld
    if words < auto.MIN_WORDS:
        return
    present = list(range(held))
    layouts = [
        [set(present)] + [set() for _ in range(candidates - 1)],
        [set(present) for _ in range(candidates)],
        [{w for w in present if rng.random() < 0.5} for _ in range(candidates)],
    ]
    bound = most_share(held, words)
    for holders in layouts:
        df = [sum(w in h for h in holders) for w in range(words)]
        idf = [math.log(1 + (candidates - d + 0.5) / (d + 0.5)) for d in df]
        for h in holders:
            if len(h) >= auto.MIN_WORDS:
                assert sum(idf[w] for w in h) / sum(idf) <= bound + 1e-12


def test_the_bound_is_reached() -> None:
    """The bound is tight: one candidate of CANDIDATES holding every word that can be held."""
    idf_one = math.log(1 + (CANDIDATES - 1 + 0.5) / 1.5)
    idf_none = math.log(1 + (CANDIDATES + 0.5) / 0.5)
    assert most_share(3, 4) == pytest.approx(3 * idf_one / (3 * idf_one + idf_none))
    assert most_share(1, 4) == 0.0  # one word: no message can be a hit
    assert most_share(4, 4) == 1.0


class _Counted:
    """Counts the searches of other conversations that `shares` skipped."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.skipped = 0
        real = auto.most_share

        def counted(held: int, words: int) -> float:
            bound = real(held, words)
            self.skipped += bound < GATE.other
            return bound

        monkeypatch.setattr(auto, "most_share", counted)


def test_skipping_the_other_conversations_keeps_the_same_hits(new_db, monkeypatch, request):
    """For every bar, what reaches it with the skip is what reaches it in the full computation
    (no bar: nothing is skipped); `fires` and the hits are those of the full computation."""

    @settings(max_examples=examples_on(request, 15, pg=6), deadline=None)
    @given(seed=st.integers(min_value=0, max_value=100_000))
    def check(seed: int) -> None:
        _the_same_hits_with_the_skip(new_db, monkeypatch, seed)

    check()


def _the_same_hits_with_the_skip(new_db: NewDb, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    store, convs = _history(new_db, seed)
    rng = random.Random(seed)
    counter = _Counted(monkeypatch)
    try:
        for n, cid in enumerate(convs):
            for query in _queries(rng, n):
                recall = Recall(store)
                full = shares(recall, query, cid, others=True)
                for bar in (0.3, 0.5, 0.7, 0.9):
                    quick = shares(recall, query, cid, others=True, bar=bar)
                    assert {i for i, s in quick.items() if s >= bar} == {
                        i for i, s in full.items() if s >= bar
                    }
                skipped = counter.skipped
                hits, fired = auto_hits(recall, query, cid), fires(recall, query, cid)
                if counter.skipped > skipped:  # then the same without the skip
                    with monkeypatch.context() as m:
                        m.setattr(auto, "most_share", lambda held, words: 1.0)
                        assert auto_hits(Recall(store), query, cid) == hits
                        assert fires(Recall(store), query, cid) == fired
    finally:
        store.close()


def test_the_random_histories_exercise_both_outcomes(new_db, monkeypatch) -> None:
    """Over a few of the histories above, the others' search is skipped for some queries and
    fires for others: the property test compares something."""
    counter = _Counted(monkeypatch)
    fired = 0
    for seed in range(6):
        store, convs = _history(new_db, seed)
        rng = random.Random(seed)
        for n, cid in enumerate(convs):
            for query in _queries(rng, n):
                found = shares(Recall(store), query, cid, others=True, bar=GATE.other)
                fired += any(s >= GATE.other for s in found.values())
        store.close()
    assert counter.skipped > 10 and fired > 10


def test_a_word_said_only_here_is_held_by_no_other_conversation(db) -> None:
    """ "happyness" elsewhere does not hold "happy" for the others' share: the index does not
    find "happy" there (its stem, "happi", is not "happyness"'s), so the word counts as held
    by none of them, and "happy photo ideas" cannot fire there on "photo" alone."""
    store = Store(db)
    try:
        here = store.open_conversation("here").id
        there = store.open_conversation("there").id
        store.append(here, Message("user", [Text("a happy day")]))
        store.append(there, Message("user", [Text("happyness and photo ideas")]))
        recall = Recall(store)
        assert recall.found_elsewhere("happy photo ideas", here) == ["photo", "ideas"]
        assert recall.found_elsewhere("happy photo ideas", there) == ["happy"]
        found = shares(recall, "happy photo ideas", here, others=True)
        assert list(found) and all(s < 1.0 for s in found.values())
    finally:
        store.close()


# ---- the conversation's own search --------------------------------------------------------


def _engine_like(new_db: NewDb, seed: int) -> tuple[Store, int, list[int]]:
    """A conversation grown as the engine grows one: turns, edits that move the head back
    (the rows after it stay, off the branch), /new (a separator and the floor), folds; and two
    other conversations."""
    rng = random.Random(seed)
    store = Store(new_db(f"own-{next(_NAMES)}"))
    conv = store.open_conversation("asking").id
    others = [store.open_conversation(f"o{n}").id for n in range(2)]
    branch: list[int] = []
    for i in range(rng.randint(3, 30)):
        roll = rng.random()
        if roll < 0.08 and len(branch) > 2:  # an edit: the head goes back
            branch = branch[: rng.randrange(1, len(branch))]
            store.set_head(conv, branch[-1])
        elif roll < 0.14:
            sep = Message("assistant", [Text("New conversation started.")])
            branch.append(store.append(conv, sep, kind="separator").id)
            set_history_floor(store, conv, time.time())
        elif roll < 0.2 and len(branch) > 3:
            folds.add_compaction(
                store,
                conv,
                kind="consolidation",
                reason="test",
                summary=f"summary {i}",
                first_row_id=branch[0],
                last_row_id=branch[rng.randrange(1, len(branch) - 1)],
            )
        else:
            text = _line(rng, 0)
            branch.append(store.append(conv, Message("user", [Text(text)])).id)
        if rng.random() < 0.5:
            other = rng.randrange(2)
            store.append(others[other], Message("user", [Text(_line(rng, 1 + other))]))
    return store, conv, branch


def _truly_unseen(store: Store, conv: int, seen: wiring.Seen, since: float) -> bool:
    rows = store.query("SELECT id, created FROM messages WHERE conversation_id = ?", (conv,))
    return any(r[0] not in seen.rows and r[1] >= since for r in rows)


def test_skipping_the_own_search_keeps_the_same_hits(new_db, request) -> None:
    """`unseen_own` says no only when no message of the conversation is out of view and
    written since /new; then the hits without the conversation's own search are the hits
    with it."""

    @settings(max_examples=examples_on(request, 25, pg=8), deadline=None)
    @given(seed=st.integers(min_value=0, max_value=100_000))
    def check(seed: int) -> None:
        _the_same_hits_without_the_own_search(new_db, seed)

    check()


def _the_same_hits_without_the_own_search(new_db: NewDb, seed: int) -> None:
    store, conv, _ = _engine_like(new_db, seed)
    try:
        seen = wiring.seen_by_model(store, conv)
        since = wiring.history_floor(store, conv)
        own = wiring.unseen_own(store, conv, seen, since)
        assert own or not _truly_unseen(store, conv, seen, since)
        recall = Recall(store)
        for query in _queries(random.Random(seed), 0):
            full = auto_hits(recall, query, conv, seen.ids, since=since)
            assert auto_hits(recall, query, conv, seen.ids, since=since, own=own) == full
    finally:
        store.close()


def test_the_engine_like_histories_skip_the_own_search_and_not(new_db) -> None:
    """Over a few of the histories above, the own search is skipped for some (all in view)
    and not for others (an edit, a fold, or messages before a /new written after it)."""
    outcomes = []
    for seed in range(12):
        store, conv, _ = _engine_like(new_db, seed)
        seen = wiring.seen_by_model(store, conv)
        outcomes.append(wiring.unseen_own(store, conv, seen, wiring.history_floor(store, conv)))
        store.close()
    assert True in outcomes and False in outcomes


def test_own_to_show_looks_only_in_a_large_history(db, monkeypatch) -> None:
    """A conversation whose every message is in view has nothing of its own to show; after
    an edit leaves a message off the branch it has. In a small history the engine does not
    look (the search costs less than the look) and answers yes."""
    store = Store(db)
    try:
        conv = store.open_conversation("c").id
        first = store.append(conv, Message("user", [Text("pottery class on Monday")])).id
        store.append(conv, Message("assistant", [Text("noted, pottery on Monday")]))
        assert wiring.own_to_show(store, conv) is True  # small: not looked at
        monkeypatch.setattr(wiring, "SMALL_HISTORY", 0)
        assert wiring.own_to_show(store, conv) is False
        store.set_head(conv, first)  # an edit: the reply is off the branch
        assert wiring.own_to_show(store, conv) is True
    finally:
        store.close()
