"""A search scoped to one conversation (or to every other one) ranks what the plain forms of
the filter rank, and FTS5 runs its MATCH once for it, not once per message of the scope
(the plan behind auto-recall's 75 ms at 100,000 messages, issue 17)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from heron.memory import records
from heron.memory.auto import auto_hits
from heron.memory.recall import Recall
from heron.messages import Message, Text
from heron.store import Store

WORDS = [
    "apple",
    "pie",
    "crumble",
    "tart",
    "garden",
    "camping",
    "beach",
    "pottery",
    "adoption",
    "support",
    "group",
]

# The filters as they were written before (issue 17): the same rows, a slower plan.
OLD_SCOPED = (
    "SELECT rowid, -bm25(messages_fts) AS s FROM messages_fts WHERE messages_fts MATCH ?"
    " AND rowid IN (SELECT id FROM messages WHERE conversation_id = ?)"
    " ORDER BY s DESC, rowid LIMIT ?"
)
OLD_OUTSIDE = (
    "SELECT rowid, -bm25(messages_fts) AS s FROM messages_fts WHERE messages_fts MATCH ?"
    " AND (SELECT conversation_id FROM messages m WHERE m.id = messages_fts.rowid) != ?"
    " ORDER BY s DESC, rowid LIMIT ?"
)
OLD_PHRASE = (
    "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
    " AND rowid IN (SELECT id FROM messages WHERE conversation_id = ?) ORDER BY rowid LIMIT ?"
)


@pytest.fixture
def seeded(tmp_path: Path):
    """Four conversations of random sentences over a small vocabulary (many ties, many
    matches per word), interleaved as turns of several chats are."""
    rng = random.Random(17)
    store = Store(tmp_path / "scope.db")
    convs = [store.open_conversation(f"c{n}").id for n in range(4)]
    for n in range(400):
        text = " ".join(rng.choices(WORDS, k=rng.randint(2, 9)))
        store.append(convs[rng.randrange(4)] if n % 5 else convs[0], Message("user", [Text(text)]))
    yield store, convs
    store.close()


EXPRESSIONS = ['"apple"*', '"apple"* OR "pie"', '"camping"* OR "beach"* OR "group"*', '"tart"']


@pytest.mark.parametrize("expression", EXPRESSIONS)
@pytest.mark.parametrize("limit", [5, 50, 500])
def test_scoped_ranking_is_the_plain_filters_ranking(seeded, expression, limit) -> None:
    store, convs = seeded
    for cid in convs:
        old = [(r[0], r[1]) for r in store.query(OLD_SCOPED, (expression, cid, limit))]
        assert old  # every conversation holds every word: the comparison is not empty
        assert records.bm25_ranked(store, expression, limit, cid) == old
        old = [(r[0], r[1]) for r in store.query(OLD_OUTSIDE, (expression, cid, limit))]
        assert records.bm25_ranked(store, expression, limit, outside=cid) == old


def test_phrase_matches_in_a_conversation_are_the_plain_filters(seeded) -> None:
    store, convs = seeded
    for cid in convs:
        old = [r[0] for r in store.query(OLD_PHRASE, ('"apple pie"', cid, 50))]
        assert records.phrase_matches(store, '"apple pie"', cid, 50) == old


def _plans(store: Store, run: object) -> list[str]:
    """The query plan of each full-text statement `run()` executes."""
    seen: list[str] = []
    store.conn.set_trace_callback(seen.append)
    try:
        assert callable(run)
        run()
    finally:
        store.conn.set_trace_callback(None)
    plans = []
    for sql in seen:
        if "messages_fts MATCH" in sql and sql.lstrip().upper().startswith("SELECT"):
            rows = store.conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
            plans.append(" | ".join(r[3] for r in rows))
    return plans


def test_fts5_runs_the_match_once_for_a_scope_not_per_message(seeded) -> None:
    store, convs = seeded
    plans = _plans(
        store,
        lambda: (
            records.bm25_ranked(store, '"apple"*', 10, convs[0]),
            records.bm25_ranked(store, '"apple"*', 10, outside=convs[0]),
            records.phrase_matches(store, '"apple pie"', convs[0], 10),
        ),
    )
    assert len(plans) == 3
    for plan in plans:
        scan = re.search(r"VIRTUAL TABLE INDEX \d+:(\S*)", plan)
        assert scan is not None, plan
        # "=": FTS5 is handed a rowid to look up, once for each id of the conversation
        assert "=" not in scan.group(1), plan


def test_auto_recall_hits_are_those_of_the_plain_filters(seeded, monkeypatch) -> None:
    """The whole gate, on the seeded store: the hits found with today's filters are the hits
    the plain filters give."""
    store, convs = seeded
    queries = ["apple pie with crumble", "camping at the beach", "pottery support group", "x"]
    new = [[auto_hits(Recall(store), q, cid) for q in queries] for cid in convs]

    def old_ranked(store_, expression, limit, conversation_id=None, outside=None):
        if conversation_id is not None:
            rows = store_.query(OLD_SCOPED, (expression, conversation_id, limit))
        elif outside is not None:
            rows = store_.query(OLD_OUTSIDE, (expression, outside, limit))
        else:
            return records_bm25(store_, expression, limit)
        return [(r[0], r[1]) for r in rows]

    records_bm25 = records.bm25_ranked
    monkeypatch.setattr(records, "bm25_ranked", old_ranked)
    old = [[auto_hits(Recall(store), q, cid) for q in queries] for cid in convs]
    assert new == old
    assert any(h for per in new for h in per)  # something fired: the comparison says something
