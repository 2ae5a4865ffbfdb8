"""A history without sentence vectors (the embeddings extra installed on a long history, a
new model) is not embedded inside a search: the search ranks with the vectors there are and
says it is behind, and `heron memory index` or the serve's background filling embeds the rest,
a batch at a time, resumably, on both backends."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from heron.cli import app
from heron.config import Settings
from heron.memory import backfill, vectors
from heron.memory.recall import Recall
from heron.messages import assistant, user
from heron.store import Store

QUERIES = {"puppy", "weather", "weather note 7"}  # what the tests search for


class CountingEmbedder:
    """Dogs (and puppies) one way, everything else the other; counts the messages it was
    asked to embed (not the one-text queries)."""

    name = "fake"

    def __init__(self) -> None:
        self.encoded = 0

    def encode(self, texts):
        self.encoded += sum(1 for t in texts if t not in QUERIES)
        return [[1.0, 0.0] if "dog" in t or "puppy" in t else [0.0, 1.0] for t in texts]


def _history(store: Store, n: int) -> int:
    """n messages, the last about a dog (found by meaning alone as 'puppy': no shared word;
    last, as each message is embedded with the one before it); its id."""
    c = store.open_conversation("long")
    for i in range(n - 1):
        store.append(c.id, user(f"weather note {i}") if i % 2 else assistant(f"noted {i}"))
    return store.append(c.id, user("Our dog Rex came home")).id


@pytest.fixture
def store(db):
    opened = Store(db)
    yield opened
    opened.close()


def test_a_search_embeds_a_few_new_messages_itself(store):
    _history(store, vectors.INLINE_MOST)
    embedder = CountingEmbedder()
    recall = Recall(store, embedder)
    assert recall.search("puppy", 1)[0].snippet.startswith("Our dog Rex")
    assert embedder.encoded == vectors.INLINE_MOST and not recall.behind


def test_a_search_embeds_the_oldest_of_a_backlog_and_says_it_is_behind(store):
    dog = _history(store, vectors.INLINE_MOST + 1)  # the newest message is left for later
    embedder = CountingEmbedder()
    recall = Recall(store, embedder)
    found = recall.search("weather note 7", 1)  # the words still find what they hold
    assert found[0].snippet == "weather note 7"
    assert embedder.encoded == vectors.INLINE_MOST and recall.behind
    assert vectors.backlog(store, embedder) == 1
    assert vectors.backfill(store, embedder) == 1  # what `heron memory index` does
    assert vectors.backlog(store, embedder) == 0
    assert [i for i, _ in recall.semantic("puppy", 1)] == [dog]
    assert not recall.behind and embedder.encoded == vectors.INLINE_MOST + 1  # never twice


def test_successive_searches_work_through_a_backlog_a_bounded_share_each(store):
    dog = _history(store, 2 * vectors.INLINE_MOST + 10)
    embedder = CountingEmbedder()
    recall = Recall(store, embedder)
    recall.search("weather", 1)
    recall.search("weather", 1)
    assert recall.behind and embedder.encoded == 2 * vectors.INLINE_MOST  # never more a search
    assert recall.search("puppy", 1)[0].message_id == dog  # the third reaches the newest
    assert not recall.behind and vectors.backlog(store, embedder) == 0


def test_backfill_goes_a_batch_at_a_time_and_resumes_where_it_stopped(store):
    _history(store, 10)
    embedder = CountingEmbedder()
    told: list[int] = []
    assert vectors.backfill(store, embedder, told.append, batches=2, size=3) == 6
    assert told == [3, 3] and vectors.backlog(store, embedder) == 4
    assert vectors.backfill(store, embedder, told.append, size=3) == 4
    assert told == [3, 3, 3, 1] and vectors.backlog(store, embedder) == 0


def test_the_serves_background_filling_embeds_everything_in_small_batches(db, monkeypatch):
    monkeypatch.setattr(backfill, "PAUSE_S", 0.0)
    monkeypatch.setattr(backfill, "BATCH", 16)
    opened = Store(db)
    _history(opened, vectors.INLINE_MOST + 20)
    opened.close()
    embedder = CountingEmbedder()
    assert asyncio.run(backfill.backfill_vectors(db, embedder)) == vectors.INLINE_MOST + 20
    assert asyncio.run(backfill.backfill_vectors(db, embedder)) == 0  # nothing left
    opened = Store(db)
    assert vectors.backlog(opened, embedder) == 0
    opened.close()


def test_memory_index_embeds_the_backlog_and_recall_says_when_it_is_behind(heron_home, monkeypatch):
    embedder = CountingEmbedder()
    monkeypatch.setattr(vectors, "default_embedder", lambda: embedder)
    store = Store(Settings.load().database)
    _history(store, vectors.INLINE_MOST + 5)
    store.close()
    searched = CliRunner().invoke(app, ["memory", "recall", "weather note 7"])
    assert searched.exit_code == 0 and "weather note 7" in searched.stdout
    assert (
        "have no sentence vector yet" in searched.stderr and "heron memory index" in searched.stderr
    )
    indexed = CliRunner().invoke(app, ["memory", "index"])
    assert indexed.exit_code == 0, indexed.output
    assert "Embedded 5 messages." in indexed.stdout  # the search embedded the oldest ones
    again = CliRunner().invoke(app, ["memory", "recall", "puppy"])
    assert (
        "Our dog Rex" in again.stdout.splitlines()[0] and "no sentence vector" not in again.stderr
    )
    assert (
        CliRunner().invoke(app, ["memory", "index"]).stdout.strip()
        == "Every message has its vector."
    )


def test_memory_index_without_the_extra_says_how_to_get_it(heron_home, monkeypatch):
    monkeypatch.setattr(vectors, "default_embedder", lambda: None)
    result = CliRunner().invoke(app, ["memory", "index"])
    assert result.exit_code == 1 and "embeddings extra is not installed" in result.stderr
