"""Recall's small noise (QA22t Low 7): a message next to two branches of the same text takes a
neighbour's share once, not once per branch."""

from __future__ import annotations

from pathlib import Path

import pytest

from heron.memory.recall import Recall
from heron.messages import Message, Text, assistant, user
from heron.serve.api import _search
from heron.store import Store


@pytest.fixture
def store(db: str | Path):  # once per backend (tests/pg.py)
    s = Store(db)
    yield s
    s.close()


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
