"""A question asked again and again must not crowd the fact it asks about out of recall
(QA21v L4): messages that say the same text are one hit, and a message that asks follows one
that tells the same words."""

from __future__ import annotations

from pathlib import Path

import pytest

from heron.memory.auto import auto_hits
from heron.memory.recall import Recall
from heron.messages import assistant, user
from heron.store import Store

FACT = "My budget for the kitchen renovation is 48,250 euros and the contractor is Ottavio."
ASKED = ["What was the budget I gave for the kitchen renovation?"] * 6
ASKED += ["what was the budget I gave for the  kitchen renovation", "WHAT was the budget I gave"
          " for the kitchen renovation??"]  # fmt: skip


@pytest.fixture
def store(db: str | Path):  # once per backend (tests/pg.py)
    s = Store(db)
    yield s
    s.close()


def _asked_again_and_again(store: Store) -> tuple[int, int, list[int]]:
    c = store.open_conversation("long")
    fact = store.append(c.id, user(FACT)).id
    store.append(c.id, assistant("Got it, I will keep that in mind."))
    asked = []
    for n, question in enumerate(ASKED):
        store.append(c.id, user(f"Log entry {n}: watered the plants"))
        store.append(c.id, assistant("Logged."))
        asked.append(store.append(c.id, user(question)).id)
        store.append(c.id, assistant("Let me look that up."))
    return c.id, fact, asked


def test_a_question_asked_again_and_again_is_one_hit_and_the_fact_comes_first(store):
    _, fact, asked = _asked_again_and_again(store)
    hits = Recall(store).search("budget kitchen renovation", 3)
    assert hits[0].message_id == fact
    copies = [h for h in hits if "what was the budget" in h.snippet.lower()]
    # the newest of them stands for all, with how many they are
    assert [(h.message_id, h.times) for h in copies] == [(asked[-1], len(asked))]
    assert f"· you · asked {len(asked)} times]" in copies[0].line("you")
    assert hits[0].times == 1 and "times" not in hits[0].line()


def test_auto_recall_still_fires_for_a_fact_asked_about_again_and_again(store):
    cid, fact, asked = _asked_again_and_again(store)
    found = auto_hits(Recall(store), ASKED[0], cid, asked)
    assert fact in [a.hit.message_id for a in found]


def test_a_statement_ranks_before_a_question_holding_the_same_words(store):
    c = store.open_conversation("c")
    told = store.append(c.id, user("The spare key of the garden shed hangs in the garage.")).id
    store.append(c.id, assistant("Good to know."))
    question = store.append(c.id, user("Where is the spare key of the garden shed?")).id
    ranked = [i for i, _ in Recall(store).ranked("spare key garden shed", 5)]
    assert ranked.index(told) < ranked.index(question)
