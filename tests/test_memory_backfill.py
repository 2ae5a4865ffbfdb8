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


class CountingEmbedder:
    """Dogs (and puppies) one way, everything else the other; counts the messages it was
    asked to embed (not the one-text queries)."""

    name = "fake"

    def __init__(self) -> None:
        self.encoded = 0

    def encode(self, texts):
        self.encoded += len(texts) if len(texts) > 1 else 0
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


def test_a_backlog_is_left_to_the_index_and_the_search_says_it_is_behind(store):
    dog = _history(store, vectors.INLINE_MOST + 1)
    embedder = CountingEmbedder()
    recall = Recall(store, embedder)
    found = recall.search("weather note 7", 1)  # the words still find what they hold
    assert found[0].snippet == "weather note 7"
    assert embedder.encoded == 0 and recall.behind
    assert vectors.backlog(store, embedder) == vectors.INLINE_MOST + 1
    assert [i for i, _ in recall.semantic("puppy", 1)] != [dog]  # no vector yet
    assert vectors.backfill(store, embedder) == vectors.INLINE_MOST + 1
    assert vectors.backlog(store, embedder) == 0
    assert [i for i, _ in recall.semantic("puppy", 1)] == [dog]
    assert not recall.behind and embedder.encoded == vectors.INLINE_MOST + 1  # never twice


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
    assert f"Embedded {vectors.INLINE_MOST + 5} messages." in indexed.stdout
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
