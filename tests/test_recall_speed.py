"""The fast paths of fused recall answer what the plain ones answer: the sign-bit prefilter
keeps the exact best matches, neighbours and sessions held in memory equal those read from
SQL, the BM25 order is FTS5's rank order, and a query is encoded on one torch thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from heron.memory import vectors
from heron.memory.recall import Recall
from heron.messages import Message, ToolCall, assistant, user
from heron.store import Store

np = pytest.importorskip("numpy")


@pytest.fixture
def store(db: str | Path):  # once per backend (tests/pg.py)
    s = Store(db)
    yield s
    s.close()


def _clustered(count: int, dims: int, seed: int) -> np.ndarray:
    """Unit vectors around 40 topics, as sentence vectors cluster."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dims))
    rows = centres[rng.integers(0, 40, count)] + 0.6 * rng.standard_normal((count, dims))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _similarities(matrix, query, conversations=None, conversation_id=None):
    ids = np.arange(1, len(matrix) + 1, dtype=np.int64)
    if conversations is None:
        conversations = np.zeros(len(matrix), dtype=np.int64)
    signs = np.asfortranarray(vectors.sign_bits(matrix))
    query_signs = vectors.sign_bits(query[None, :])[0]
    return vectors.Similarities(
        ids, matrix, signs, conversations, query, query_signs, conversation_id
    )


def _exact_top(matrix, query, limit, rows=None):
    scores = matrix @ query
    order = np.argsort(-scores, kind="stable")
    if rows is not None:
        order = [i for i in order if i in set(rows)]
    return [int(i) + 1 for i in order[:limit]]


needs_prefilter = pytest.mark.skipif(
    not vectors.prefilter_ready(), reason="numpy without bitwise_count: always exact"
)


@needs_prefilter
def test_prefilter_scores_few_rows_and_keeps_the_exact_best():
    matrix = _clustered(30_000, 96, seed=1)
    assert len(matrix) > vectors.PREFILTER_MIN
    rng = np.random.default_rng(3)
    for source in rng.integers(0, len(matrix), 25):
        # A query close to one stored message (how close real ones are: docs/memory.md).
        query = matrix[source] + 0.05 * rng.standard_normal(96).astype(np.float32)
        query /= np.linalg.norm(query)
        similar = _similarities(matrix, query)
        rows = similar._candidates(10)
        assert 2_000 <= len(rows) < 4_000  # far from every row
        # Every row nearer in sign bits than the farthest kept is kept too (ties included).
        distance = vectors.hamming(similar.signs, similar.query_signs)
        assert set(np.flatnonzero(distance <= distance[rows].max())) == set(rows)
        top = similar.top(10)
        assert list(top) == _exact_top(matrix, query, 10)
        assert next(iter(top)) == source + 1
        for message_id, score in top.items():  # scores are exact, not estimated from bits
            assert score == pytest.approx(float(matrix[message_id - 1] @ query), abs=1e-6)


def test_small_sets_are_scored_exactly():
    matrix = _clustered(3_000, 32, seed=3)
    query = _clustered(1, 32, seed=4)[0]
    similar = _similarities(matrix, query)
    assert similar._candidates(20) is None
    assert list(similar.top(20)) == _exact_top(matrix, query, 20)


@needs_prefilter
def test_prefilter_stays_within_the_conversation(monkeypatch):
    monkeypatch.setattr(vectors, "PREFILTER_MIN", 100)
    monkeypatch.setattr(vectors, "PREFILTER_FLOOR", 200)
    matrix = _clustered(2_000, 32, seed=5)
    conversations = np.arange(2_000, dtype=np.int64) % 2
    query = _clustered(1, 32, seed=6)[0]
    similar = _similarities(matrix, query, conversations, conversation_id=1)
    rows = similar._candidates(5)
    assert 200 <= len(rows) < 1_000  # the prefilter ran on the conversation's 1,000
    assert set(conversations[rows]) == {1}
    top = similar.top(5)
    # The exact best among the candidates, with exact scores.
    assert list(top) == _exact_top(matrix, query, 5, rows=rows)
    assert list(top.values()) == pytest.approx([float(matrix[i - 1] @ query) for i in top])
    wanted = [1, 2, 3, 4, 99_999]  # odd rows are conversation 1; 99,999 does not exist
    assert sorted(similar.of(wanted)) == [2, 4]


def test_empty_index_gives_nothing(store):
    class Never:
        name = "never"

        def encode(self, texts):
            raise AssertionError("no query is encoded when there is nothing to compare")

    similar = vectors.similarities(store, Never(), "anything")
    assert similar.top(10) == {} and similar.of([1, 2]) == {}


class KeywordEmbedder:
    name = "keywords"
    words = ("dog", "cat", "rain", "tax")

    def encode(self, texts):
        return [[1.0 if w in t.lower() else 0.01 for w in self.words] for t in texts]


def _conversation(store: Store, key: str, lines: list[str]) -> list[int]:
    conv = store.open_conversation(key)
    ids = []
    for i, line in enumerate(lines):
        ids.append(store.append(conv.id, user(line) if i % 2 == 0 else assistant(line)).id)
    return ids


def test_neighbours_and_sessions_held_in_memory_match_sql(store):
    a = _conversation(store, "a", ["my dog barks", "which dog?", "the old one", "rain again"])
    call = Message("assistant", [ToolCall("c1", "bash", {"cmd": "ls"})])  # no text
    tool = store.append(store.conversation("a").id, call).id
    after = store.append(store.conversation("a").id, user("cat food is out")).id
    b = _conversation(store, "b", ["tax forms", "due friday", "dog walk"])
    recall = Recall(store, KeywordEmbedder())
    recall.index_missing()
    recall.semantic("dog", 3)  # loads the vectors held
    index = recall._vectors
    texts = [*a, after, *b]
    assert index.rows_of(texts) is not None
    assert index.rows_of([tool]) is None  # no text, no vector: not held
    wanted = [a[1], a[3], after, b[0]]
    near = recall.neighbours(wanted)
    # SQL also finds the tool call (a neighbour with no text, never a hit); memory skips it.
    expected = {k: {n for n in v if n != tool} for k, v in near.items() if k != tool}
    expected = {k: v for k, v in expected.items() if v}
    assert index.neighbours(wanted) == expected
    pool = set(texts)
    assert index.sessions(pool) == recall.sessions(pool)
    assert index.sessions([tool]) is None


def test_fused_ranking_is_the_same_from_memory_and_from_sql(store, monkeypatch):
    lines = ["my dog barks at night", "rain all week", "the cat sleeps", "tax is due"]
    for c in range(6):
        _conversation(store, f"c{c}", [f"{lines[(c + i) % 4]} {c} {i}" for i in range(12)])
    fast = Recall(store, KeywordEmbedder())
    queries = ["dog at night", "when is the tax due", "cat", "rain week dog"]
    got = [fast.ranked(q, 10) for q in queries]
    slow = Recall(store, KeywordEmbedder())
    slow.ranked("warm up", 1)
    monkeypatch.setattr(slow._vectors, "neighbours", lambda ids: None)
    monkeypatch.setattr(slow._vectors, "sessions", lambda ids: None)
    assert [slow.ranked(q, 10) for q in queries] == got


def test_vectors_held_grow_in_place_and_follow_deletions(store):
    conv = store.open_conversation("grow")
    recall = Recall(store, KeywordEmbedder())
    for step in range(5):
        for i in range(7):
            store.append(conv.id, user(f"dog {step} {i}" if i % 2 else f"rain {step} {i}"))
        recall.semantic("dog", 1)
        index = recall._vectors
        stored = store.query(
            "SELECT message_id, vector FROM message_vectors WHERE model = ? ORDER BY message_id",
            (index.key,),
        )
        assert index.ids.tolist() == [r[0] for r in stored]
        matrix = np.frombuffer(b"".join(r[1] for r in stored), dtype=np.float32)
        assert np.array_equal(index.matrix, matrix.reshape(len(stored), -1))
        if index.signs is not None:
            assert np.array_equal(index.signs, vectors.sign_bits(index.matrix))
    other = store.open_conversation("other")
    kept = store.append(other.id, user("cat on the mat")).id
    store.delete_conversation(conv.id)
    assert [i for i, _ in recall.semantic("cat", 5)] == [kept]
    assert recall._vectors.ids.tolist() == [kept]


# FTS5's expressions and the tsqueries PostgreSQL's form of them must be.
RANKED = {
    '"apple"*': "'apple':*",
    '"apple"* OR "pie"': "'apple':* | 'pie'",
    '"crumble"* OR "tart"*': "'crumble':* | 'tart':*",
    '"pie"': "'pie'",
}


def test_bm25_order_is_fts5_rank_order_with_ties_by_id(store):
    """The backend's own ranking, ties by id: FTS5's rank (-bm25) on SQLite, ts_rank over the
    tsvector column on PostgreSQL."""
    conv = store.open_conversation("c")
    same = [store.append(conv.id, user("apple pie")).id for _ in range(4)]
    for i in range(30):
        store.append(conv.id, user(f"apple {'crumble ' * (i % 5)}tart {i}"))
    recall = Recall(store)
    assert [i for i, _ in recall.bm25("pie", 10)] == same  # equal scores: lowest id first
    for expr, tsquery in RANKED.items():
        if store.backend == "sqlite":
            sql = (
                "SELECT rowid, -bm25(messages_fts) FROM messages_fts WHERE messages_fts MATCH ?"
                " ORDER BY rank LIMIT 20"
            )
            rows = store.query(sql, (expr,))
        else:
            sql = (
                "SELECT id, ts_rank(body_tsv, q) AS s FROM messages,"
                " to_tsquery('english', ?) q WHERE body_tsv @@ q ORDER BY s DESC, id LIMIT 20"
            )
            rows = store.query(sql, (tsquery,))
        query = " ".join(w.strip('"*') for w in expr.split(" OR "))
        assert recall.bm25(query, 20) == [(r[0], r[1]) for r in rows]


def test_a_query_is_encoded_on_one_torch_thread():
    torch = pytest.importorskip("torch")

    class Model:
        def __init__(self) -> None:
            self.threads: list[int] = []

        def encode(self, texts, **_):
            self.threads.append(torch.get_num_threads())
            return np.ones((len(texts), 4), dtype=np.float32)

    embedder = vectors.SentenceEmbedder.__new__(vectors.SentenceEmbedder)
    embedder._model = Model()
    embedder._plain = None  # the generic path, which this stand-in model plays
    embedder._lock = threading.Lock()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert embedder.encode(["a question"]) == [[1.0] * 4]
        embedder.encode(["many", "texts"])
        assert embedder._model.threads == [1, 2]  # a batch keeps torch's setting
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_one_text_straight_through_the_network_matches_the_generic_path(monkeypatch):
    monkeypatch.setenv("HERON_EMBEDDINGS", "1")  # the conftest keeps the model out elsewhere
    if not vectors.available():
        pytest.skip("the heron[embeddings] extra is not installed")
    embedder = vectors.default_embedder()
    assert embedder is not None and embedder._plain is not None
    texts = [
        "When did Caroline go to the LGBTQ support group?",
        "Melanie: " + "we painted the lake at sunrise and " * 60,  # cut at 256 tokens
        "ünïcödé, emoji 🙂 and\ttabs",
        "",
    ]
    for text in texts:
        straight = np.array(embedder.encode([text])[0])
        generic = embedder._model.encode([text], normalize_embeddings=True)[0]
        assert np.abs(straight - generic).max() < 1e-5, text
    both = np.array(embedder.encode(texts[:2]))  # a batch takes the generic path
    assert np.abs(both[0] - np.array(embedder.encode(texts[:1])[0])).max() < 1e-5
