"""Auto-recall's quick check (`Recall.any_above`) answers exactly what scoring every hit with
bm25 answers, while leaving out phrases common enough that they cannot change the answer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from heron.memory.recall import Recall, bm25_bound
from heron.messages import assistant, user
from heron.store import Store

WORDS = [
    "apple",
    "banana",
    "cherry",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "t.db")
    yield s
    s.close()


def _naive(recall: Recall, text: str, min_score: float) -> bool:
    return any(s >= min_score for _, s in recall.bm25(text, 3))


def test_any_above_agrees_with_the_full_search(store):
    rng = random.Random(7)
    for c in range(20):
        conv = store.open_conversation(f"c{c}")
        for i in range(15):
            # "message" in every user row: a phrase whose bound is tiny, left out first
            rare = " ".join(rng.sample(WORDS, rng.randint(0, 3)))
            store.append(conv.id, user(f"c{c} message {i} {rare}"))
            store.append(conv.id, assistant("ok" if i % 3 else f"ok {rng.choice(WORDS)}"))
    recall = Recall(store)
    queries = ["c3 message 4", "message", "message ok", "apple banana message", "zebra"]
    queries += [" ".join(rng.sample(WORDS, k)) + " message" for k in (1, 2, 3) for _ in range(4)]
    checked = 0
    for text in queries:
        scores = [s for _, s in recall.bm25(text, 3)]
        for min_score in [0.5, 2.0, 5.0, 10.0, *scores, *(s + 1e-6 for s in scores)]:
            assert recall.any_above(text, min_score) == _naive(recall, text, min_score), (
                text,
                min_score,
            )
            checked += 1
    assert checked > 100


def test_a_phrase_in_half_the_rows_or_more_adds_almost_nothing():
    assert bm25_bound(1000, 500) == pytest.approx(2.2e-6)
    assert bm25_bound(1000, 5) > 10  # a rare word alone can pass auto-recall's bar


def test_the_common_word_is_not_scored_when_the_rare_ones_decide(store, monkeypatch):
    conv = store.open_conversation("a")
    for i in range(200):
        store.append(conv.id, user(f"message {i}"))
    recall = Recall(store)
    exprs: list[str] = []
    inner = recall._best_score
    monkeypatch.setattr(recall, "_best_score", lambda e: exprs.append(e) or inner(e))
    monkeypatch.setattr(recall, "bm25", lambda *a, **k: pytest.fail("full search ran"))
    assert recall.any_above("message 17", 10.0) is False
    assert exprs == ['"17"']
