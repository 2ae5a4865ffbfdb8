"""A search scoped to one conversation (or to every other one) ranks what the plain forms of
the filter rank, and FTS5 runs its MATCH once for it, not once per message of the scope
(the plan behind auto-recall's 75 ms at 100,000 messages, issue 17). The tests of the ranking
run on both backends (`seeded`); those of FTS5's SQL and plans on SQLite (`seeded_fts5`)."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg import schema_url

from heron.memory import auto, records
from heron.memory import recall as recall_module
from heron.memory.auto import auto_hits
from heron.memory.recall import Recall, held_terms, match_expression, phrase, terms
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


def _seed(where: str | Path, apart: bool = False) -> tuple[Store, list[int]]:
    """Four conversations of random sentences over a small vocabulary (many ties, many
    matches per word), interleaved as turns of several chats are; `apart`: half the lines of
    each conversation also say its word of OWN_WORDS, which no other one says."""
    rng = random.Random(17)
    store = Store(where)
    convs = [store.open_conversation(f"c{n}").id for n in range(4)]
    for n in range(400):
        text = " ".join(rng.choices(WORDS, k=rng.randint(2, 9)))
        conv = rng.randrange(4) if n % 5 else 0
        if apart and rng.random() < 0.5:
            text += " " + OWN_WORDS[conv]
        store.append(convs[conv], Message("user", [Text(text)]))
    return store, convs


Seeded = tuple[Store, list[int]]


@pytest.fixture(scope="module")
def _seeded_stores() -> Iterator[dict[tuple[str, bool], Seeded]]:
    """The module's seeded stores, each made once: the tests only read them, and seeding one
    is 400 writes (on PostgreSQL, most of this file's CPU when each test seeded its own)."""
    made: dict[tuple[str, bool], Seeded] = {}
    yield made
    for store, _ in made.values():
        store.close()


def _seeded_once(
    request: pytest.FixtureRequest, made: dict[tuple[str, bool], Seeded], backend: str, apart: bool
) -> Seeded:
    if (backend, apart) not in made:
        if backend == "sqlite":
            where: str | Path = request.getfixturevalue("tmp_path_factory").mktemp("scope") / "h.db"
        else:
            where = schema_url(request.getfixturevalue("pg_server"))
        made[(backend, apart)] = _seed(where, apart)
    return made[(backend, apart)]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=[False, True], ids=["shared", "apart"])
def seeded(backend: str, request: pytest.FixtureRequest, _seeded_stores) -> Seeded:
    """`_seed`, once per backend, with and without words of each conversation's own."""
    return _seeded_once(request, _seeded_stores, backend, request.param)


@pytest.fixture
def seeded_fts5(request: pytest.FixtureRequest, _seeded_stores) -> Seeded:
    """`_seed` in SQLite, for the tests of FTS5's own SQL and plans."""
    return _seeded_once(request, _seeded_stores, "sqlite", False)


# One per conversation, when kept apart. The index reads "happy" and "happyness" apart (their
# porter stems are "happi" and "happy"), the gate's word test does not: the others' shares
# count a word only where the index finds it.
OWN_WORDS = ["happy", "happyness", "photography", "chapel"]


EXPRESSIONS = ['"apple"*', '"apple"* OR "pie"', '"camping"* OR "beach"* OR "group"*', '"tart"']


@pytest.mark.parametrize("expression", EXPRESSIONS)
@pytest.mark.parametrize("limit", [5, 50, 500])
def test_scoped_ranking_is_the_plain_filters_ranking(seeded_fts5, expression, limit) -> None:
    store, convs = seeded_fts5
    for cid in convs:
        old = [(r[0], r[1]) for r in store.query(OLD_SCOPED, (expression, cid, limit))]
        assert old  # every conversation holds every word: the comparison is not empty
        assert records.bm25_ranked(store, expression, limit, cid) == old
        old = [(r[0], r[1]) for r in store.query(OLD_OUTSIDE, (expression, cid, limit))]
        assert records.bm25_ranked(store, expression, limit, outside=cid) == old


def test_phrase_matches_in_a_conversation_are_the_plain_filters(seeded_fts5) -> None:
    store, convs = seeded_fts5
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


def test_fts5_runs_the_match_once_for_a_scope_not_per_message(seeded_fts5) -> None:
    store, convs = seeded_fts5
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


def test_auto_recall_hits_are_those_of_the_plain_filters(seeded_fts5, monkeypatch) -> None:
    """The whole gate, on the seeded store: the hits found with today's filters are the hits
    the plain filters give."""
    store, convs = seeded_fts5
    queries = ["apple pie with crumble", "camping at the beach", "pottery support group", "x"]
    new = [[auto_hits(Recall(store), q, cid) for q in queries] for cid in convs]

    def old_ranked(store_, expression, limit, conversation_id=None, outside=None, newest=None):
        # newest (auto.OTHERS_BUDGET) bounds nothing among this store's 400 messages
        assert newest is None or newest > 400
        if conversation_id is not None:
            rows = store_.query(OLD_SCOPED, (expression, conversation_id, limit))
        elif outside is not None:
            rows = store_.query(OLD_OUTSIDE, (expression, outside, limit))
        else:
            return records_bm25(store_, expression, limit, newest=newest)
        return [(r[0], r[1]) for r in rows]

    records_bm25 = records.bm25_ranked
    monkeypatch.setattr(records, "bm25_ranked", old_ranked)
    old = [[auto_hits(Recall(store), q, cid) for q in queries] for cid in convs]
    assert new == old
    assert any(h for per in new for h in per)  # something fired: the comparison says something


@pytest.mark.parametrize("expression", EXPRESSIONS)
@pytest.mark.parametrize("limit", [5, 500])
def test_a_scoped_ranking_is_the_whole_ranking_filtered(seeded, expression, limit) -> None:
    """On either backend: ranking within a conversation, or outside it, gives the whole
    index's ranking restricted to that scope, in the same order with the same scores."""
    store, convs = seeded
    everything = records.bm25_ranked(store, expression, 10_000)
    owner = {i: c for i, c, _ in records.message_dates(store, [i for i, _ in everything])}
    for cid in convs:
        mine = [(i, s) for i, s in everything if owner[i] == cid]
        assert mine  # every conversation holds every word: the comparison is not empty
        assert records.bm25_ranked(store, expression, limit, cid) == mine[:limit]
        rest = [(i, s) for i, s in everything if owner[i] != cid]
        assert records.bm25_ranked(store, expression, limit, outside=cid) == rest[:limit]


def test_a_phrase_is_found_as_written_in_its_conversation(seeded) -> None:
    store, convs = seeded
    bodies = records.indexed_text(store, list(range(1, 401)))
    owner = {i: c for i, c, _ in records.message_dates(store, list(bodies))}
    found = 0
    for cid in convs:
        written = [i for i, b in sorted(bodies.items()) if "apple pie" in b and owner[i] == cid]
        assert records.phrase_matches(store, '"apple pie"', cid, 500) == written
        found += len(written)
    assert found  # the phrase is in the history: the comparison says something


@pytest.mark.parametrize("small_scope", [0, 1_000])
@pytest.mark.parametrize("limit", [3, 20, 60, 500])
def test_the_other_conversations_are_the_plain_ranking_without_this_one(
    seeded, monkeypatch, limit, small_scope
) -> None:
    """`Recall.bm25(outside=)` answers from the unscoped ranking when the conversation's own
    matches are all known (fewer than `limit`), and from the outside filter otherwise; when
    its own search was not made before and it is small (SMALL_SCOPE 1,000 holds each of the
    store's conversations, 0 none), from a longer unscoped ranking without its ids."""
    monkeypatch.setattr(recall_module, "SMALL_SCOPE", small_scope)
    store, convs = seeded
    for cid in convs:
        for query in ["apple pie", "camping beach group", "tart"]:
            expected = records.bm25_ranked(store, match_expression(query) or "", limit, outside=cid)
            assert Recall(store).bm25(query, limit, outside=cid) == expected
            after_own = Recall(store)
            after_own.bm25(query, limit, cid)
            assert after_own.bm25(query, limit, outside=cid) == expected


def test_a_smaller_budget_searches_only_the_rarer_words(db: str | Path) -> None:
    store = Store(db)
    try:
        conv = store.open_conversation("c")
        for n in range(30):
            store.append(conv.id, Message("user", [Text(f"common words number {n}")]))
        for _ in range(3):
            store.append(conv.id, Message("user", [Text("a rare common sight")]))
        recall = Recall(store)
        assert recall.selective_terms("rare common") == ["rare", "common"]
        assert recall.selective_terms("rare common", budget=10) == ["rare"]
        # the rarest word is searched whatever it costs: a search needs one
        assert recall.selective_terms("common words", budget=1) == ["words"]  # 30 against 33
        found = {i for i, _ in recall.bm25("rare common", 50, budget=10)}
        assert len(found) == 3
    finally:
        store.close()


@pytest.mark.parametrize("expression", EXPRESSIONS)
@pytest.mark.parametrize("newest", [1, 7, 40, 10_000])
def test_a_bounded_search_ranks_only_the_newest_matches(seeded, expression, newest) -> None:
    """`newest` keeps the ranking of the plain search, restricted to the newest matches of the
    whole index (all of them when there are fewer), with or without a conversation filter."""
    store, convs = seeded
    everything = records.bm25_ranked(store, expression, 10_000)
    floor = sorted((i for i, _ in everything), reverse=True)[:newest][-1]
    assert records.bm25_ranked(store, expression, 10_000, newest=newest) == [
        (i, s) for i, s in everything if i >= floor
    ]
    for cid in convs:
        plain = records.bm25_ranked(store, expression, 10_000, outside=cid)
        bounded = records.bm25_ranked(store, expression, 5, outside=cid, newest=newest)
        assert bounded == [(i, s) for i, s in plain if i >= floor][:5]


def test_the_other_conversations_search_scores_at_most_its_budget(seeded) -> None:
    """Auto-recall's search of other conversations ranks among the newest OTHERS_BUDGET
    matches (here 30), so a word found everywhere cannot make a turn slow; a search within
    one conversation, or with the default budget, is not bounded."""
    store, convs = seeded
    recall = Recall(store)
    expr = match_expression(" ".join(recall.selective_terms("apple crumble", 30))) or ""
    everything = records.bm25_ranked(store, expr, 10_000)
    assert len(everything) > 30
    floor = sorted((i for i, _ in everything), reverse=True)[29]
    for cid in convs:
        found = recall.bm25("apple crumble", 500, outside=cid, budget=30)
        assert found and all(i >= floor for i, _ in found)
        assert found == records.bm25_ranked(store, expr, 500, outside=cid, newest=30)
        own = recall.bm25("apple crumble", 500, cid, budget=30)
        assert own == records.bm25_ranked(store, expr, 500, cid)
    full = match_expression("apple crumble") or ""
    assert recall.bm25("apple crumble", 10_000) == records.bm25_ranked(store, full, 10_000)


MESSAGES_OF = "SELECT id FROM messages WHERE conversation_id = ?"


def _plain_shares(store: Store, text: str, cid: int, others: bool) -> dict[int, float]:
    """`auto.shares` written plainly, as it was before the step was made fast (issue 17): the
    candidates filtered in Python from the whole index's ranking (itself the plain filters'
    on either backend: `test_a_scoped_ranking_is_the_whole_ranking_filtered`; for the other
    conversations: the newest budget of the matches, without this conversation's), each body
    read alone and its words found by `held_terms`; for the other conversations only among
    the words the index finds in a message of theirs."""
    words = terms(text)
    mine = {r[0] for r in store.query(MESSAGES_OF, (cid,))}
    counted = words
    if others:
        counted = [
            w
            for w in words
            if any(i not in mine for i, _ in records.bm25_ranked(store, phrase(w), 100_000))
        ]
    budget = auto.OTHERS_BUDGET if others else 6_000
    expr = match_expression(" ".join(Recall(store).selective_terms(text, budget))) or ""
    everything = records.bm25_ranked(store, expr, 100_000)
    if others:
        newest = set(sorted((i for i, _ in everything), reverse=True)[:budget])
        kept = [(i, s) for i, s in everything if i in newest and i not in mine]
    else:
        kept = [(i, s) for i, s in everything if i in mine]
    found = [i for i, _ in sorted(kept, key=lambda r: (-r[1], r[0]))[: auto.CANDIDATES]]
    body = {i: records.indexed_text(store, [i])[i] for i in found}
    held = {i: held_terms(body[i], counted) for i in found}
    df = {w: sum(w in h for h in held.values()) for w in words}
    idf = {w: math.log(1 + (len(held) - df[w] + 0.5) / (df[w] + 0.5)) for w in words}
    said = " ".join(text.lower().split())
    return {
        i: sum(idf[w] for w in h) / sum(idf.values())
        for i, h in held.items()
        if len(h) >= 2 and " ".join(body[i].lower().split()) != said
    }


@pytest.mark.parametrize("candidates", [8, 200])
@pytest.mark.parametrize("others_budget", [30, 2_000])
def test_the_gates_shares_are_the_plain_computation(
    seeded, monkeypatch, candidates, others_budget
) -> None:
    """The gate's shares, as fast as they are made (one search of each word over all the
    candidates' bodies; the other conversations' search dropping this one's matches known
    from its own search), are those of the plain computation: the same messages with the same
    shares, for queries that drop words (a budget of 30), cap the candidates (8: this
    conversation's own search is then incomplete) or equal a message."""
    store, convs = seeded
    monkeypatch.setattr(auto, "CANDIDATES", candidates)
    monkeypatch.setattr(auto, "OTHERS_BUDGET", others_budget)
    said = next(b for b in records.indexed_text(store, list(range(1, 50))).values() if " " in b)
    queries = ["apple pie with crumble", "camping at the beach garden", "pottery group", said]
    queries += ["happy apple pie", "photo tart garden", "chapel photography happyness"]
    compared = 0
    for cid in convs:
        for query in queries:
            for others in (False, True):
                fast = auto.shares(Recall(store), query, cid, others=others)
                plain = _plain_shares(store, query, cid, others)
                assert fast.keys() == plain.keys()
                assert all(fast[i] == pytest.approx(plain[i], abs=1e-12) for i in fast)
                compared += len(fast)
    assert compared  # messages were scored: the comparison says something
