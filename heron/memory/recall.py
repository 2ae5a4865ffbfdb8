"""Recall over everything said: SQLite FTS5 (BM25), fused with sentence embeddings when the
`heron[embeddings]` extra is installed.

The full-text index (`messages_fts`, kept in sync by triggers) covers the text of every message
of every conversation, compacted rows included. A question is turned into an OR of its content
words (stop words dropped, each word also matched as a prefix), so a hit needs no exact phrase.
With embeddings, the two rankings are fused by reciprocal rank: a message that either ranking
places high comes up, and one both place high comes first.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from heron.messages import Message, ToolCall, ToolResult
from heron.store import Store

_STOPWORD_TEXT = """
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from
further had has have having he her here hers herself him himself his how i if in into is
it its itself just me more most my myself no nor not now of off on once only or other our
ours ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself
yourselves s t don didn doesn isn wasn weren won ll ve re d m o y also ever much many kind
like thing things get got
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Tuned on the LoCoMo dev file (bench/recall.py): a small k lets the top of each ranking count;
# the semantic ranking is the weaker of the two on conversational recall, so it weighs less.
RRF_K = 10
SEMANTIC_WEIGHT = 0.5
NEIGHBOUR_SHARE = 0.5  # of a hit's score lent to the messages before and after it
MATCH_BUDGET = 6_000  # messages scored per search, at most (see selective_terms)


@dataclass(frozen=True)
class Hit:
    message_id: int
    conversation_id: int
    conversation_key: str
    role: str
    created: float
    snippet: str
    score: float

    def line(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created))
        text = " ".join(self.snippet.split())
        return (
            f"[{self.conversation_key} · {when} · message {self.message_id} · {self.role}] {text}"
        )


class Embedder(Protocol):
    name: str

    def encode(self, texts: Sequence[str]) -> list[list[float]]: ...


def terms(query: str) -> list[str]:
    """The content words of a query, lowercased, in order, without repeats."""
    seen: list[str] = []
    for word in _WORD.findall(query.lower()):
        if word not in STOPWORDS and word not in seen and (len(word) > 1 or word.isdigit()):
            seen.append(word)
    return seen


def match_expression(query: str, prefix: bool = True) -> str | None:
    """An FTS5 MATCH expression: an OR of the quoted terms (quoting makes every word literal,
    so no user text is read as FTS syntax), each also as a prefix when long enough."""
    words = terms(query)
    if not words:
        return None
    parts = []
    for w in words:
        parts.append(f'"{w}"*' if prefix and len(w) >= 4 else f'"{w}"')
    return " OR ".join(parts)


class Recall:
    def __init__(self, store: Store, embedder: Embedder | None = None) -> None:
        self.store = store
        self.embedder = embedder

    def document_frequency(self, word: str, cap: int = MATCH_BUDGET + 1) -> int:
        """How many messages hold `word`, counted up to `cap` (counting further costs time
        and changes nothing)."""
        return self.store.query(
            "SELECT count(*) FROM (SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? LIMIT ?)",
            (f'"{word}"', cap),
        )[0][0]

    def selective_terms(self, query: str) -> list[str]:
        """The query's terms, dropping the most common ones once the rarer ones already match
        MATCH_BUDGET messages: BM25 gives a word found everywhere almost no weight, but scoring
        every message holding it is what makes a search slow on a large history."""
        words = terms(query)
        if len(words) <= 1:
            return words
        frequency = {w: self.document_frequency(w) for w in words}
        kept: list[str] = []
        total = 0
        for word in sorted(words, key=lambda w: frequency[w]):
            df = frequency[word]
            if kept and total + df > MATCH_BUDGET:
                break
            kept.append(word)
            total += df
        return [w for w in words if w in kept]

    def bm25(
        self, query: str, limit: int = 20, conversation_id: int | None = None
    ) -> list[tuple[int, float]]:
        """(message id, score) best first; score is -bm25, so higher is better."""
        expr = match_expression(" ".join(self.selective_terms(query)))
        if expr is None:
            return []
        sql = "SELECT rowid, -bm25(messages_fts) AS s FROM messages_fts WHERE messages_fts MATCH ?"
        params: list[object] = [expr]
        if conversation_id is not None:
            sql += " AND rowid IN (SELECT id FROM messages WHERE conversation_id = ?)"
            params.append(conversation_id)
        sql += " ORDER BY rank LIMIT ?"
        params.append(limit)
        return [(r[0], r[1]) for r in self.store.query(sql, params)]

    def semantic(
        self, query: str, limit: int = 20, conversation_id: int | None = None
    ) -> list[tuple[int, float]]:
        if self.embedder is None:
            return []
        from heron.memory import vectors

        self.index_missing(conversation_id)
        return vectors.nearest(self.store, self.embedder, query, limit, conversation_id)

    def index_missing(self, conversation_id: int | None = None) -> int:
        """Embed the messages that have no vector yet (new since the last search)."""
        if self.embedder is None:
            return 0
        from heron.memory import vectors

        return vectors.index_missing(self.store, self.embedder, conversation_id)

    def lexical(
        self, query: str, limit: int = 10, conversation_id: int | None = None
    ) -> list[tuple[int, float]]:
        """BM25 with each hit lending part of its score to the messages just before and after
        it: the answer to a question often sits next to the words the question uses."""
        return self.spread(self.bm25(query, max(limit * 5, 100), conversation_id))[:limit]

    def spread(self, ranked: list[tuple[int, float]]) -> list[tuple[int, float]]:
        if not ranked:
            return []
        ids = [i for i, _ in ranked]
        marks = ",".join("?" * len(ids))
        rows = self.store.query(
            f"SELECT id, parent_id FROM messages WHERE id IN ({marks}) OR parent_id IN ({marks})",
            ids + ids,
        )
        neighbours: dict[int, set[int]] = {}
        for child, parent in rows:
            if parent is not None:
                neighbours.setdefault(child, set()).add(parent)
                neighbours.setdefault(parent, set()).add(child)
        scores: dict[int, float] = {}
        for item, score in ranked:
            scores[item] = scores.get(item, 0.0) + score
            for near in neighbours.get(item, ()):
                scores[near] = scores.get(near, 0.0) + NEIGHBOUR_SHARE * score
        return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))

    def ranked(
        self, query: str, limit: int = 10, conversation_id: int | None = None
    ) -> list[tuple[int, float]]:
        """Message ids best first: BM25 alone, or fused with the semantic ranking."""
        depth = max(limit * 5, 100)
        lexical = self.lexical(query, depth, conversation_id)
        if self.embedder is None:
            return lexical[:limit]
        semantic = self.spread(self.semantic(query, depth, conversation_id))
        return fuse([lexical, semantic], weights=(1.0, SEMANTIC_WEIGHT))[:limit]

    def search(
        self,
        query: str,
        limit: int = 10,
        *,
        conversation_id: int | None = None,
        exclude: Iterable[int] = (),
    ) -> list[Hit]:
        skip = set(exclude)
        ranked = [(i, s) for i, s in self.ranked(query, limit + len(skip), conversation_id)]
        ranked = [(i, s) for i, s in ranked if i not in skip][:limit]
        return self._hits(ranked, query)

    def body(self, hit: Hit) -> str:
        """The indexed text of a hit's message, whole."""
        rows = self.store.query("SELECT body FROM messages_fts WHERE rowid = ?", (hit.message_id,))
        return rows[0][0] if rows else ""

    def _hits(self, ranked: list[tuple[int, float]], query: str) -> list[Hit]:
        if not ranked:
            return []
        ids = [i for i, _ in ranked]
        marks = ",".join("?" * len(ids))
        rows = self.store.query(
            f"SELECT m.id, m.conversation_id, c.key, m.role, m.created, f.body"
            f" FROM messages m JOIN conversations c ON c.id = m.conversation_id"
            f" JOIN messages_fts f ON f.rowid = m.id WHERE m.id IN ({marks})",
            ids,
        )
        by_id = {r[0]: r for r in rows}
        words = terms(query)
        return [
            Hit(i, r[1], r[2], r[3], r[4], snippet(r[5], words), score)
            for i, score in ranked
            if (r := by_id.get(i)) is not None
        ]


def fuse(
    rankings: Sequence[Sequence[tuple[int, float]]],
    k: int = RRF_K,
    weights: Sequence[float] | None = None,
) -> list[tuple[int, float]]:
    """Weighted reciprocal-rank fusion: sum of w/(k + rank) over the rankings holding an id."""
    scores: dict[int, float] = {}
    for n, ranking in enumerate(rankings):
        weight = weights[n] if weights else 1.0
        for rank, (item, _) in enumerate(ranking):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank + 1)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


def snippet(text: str, words: Sequence[str], width: int = 300) -> str:
    """The part of `text` around its first query word, about `width` characters."""
    if len(text) <= width:
        return text
    lower = text.lower()
    hits = [p for w in words if (p := lower.find(w)) >= 0]
    start = max(0, min(hits) - width // 3) if hits else 0
    piece = text[start : start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(text) else "")


# Checked on the LoCoMo dev conversations against 20 unrelated chat lines (bench-style, see
# docs/memory.md): at 8 alone a fifth of them fired on one rare shared word ("landlord"); at 10
# with at least two of the query's words in the hit, one in twenty fires, and 43% of the
# benchmark's questions still bring their evidence in.
AUTO_RECALL_MIN_SCORE = 10.0  # -bm25 of a hit; below it, hits are too weak to inject
AUTO_RECALL_MIN_TERMS = 2  # distinct query words a hit must hold (all of them if fewer)
AUTO_RECALL_HITS = 3


def matched_terms(body: str, words: Sequence[str]) -> int:
    """How many of `words` occur in `body` (a long word also as a prefix, as the query does)."""
    tokens = set(_WORD.findall(body.lower()))
    return sum(
        1 for w in words if w in tokens or (len(w) >= 4 and any(t.startswith(w) for t in tokens))
    )


def auto_recall(
    recall: Recall,
    text: str,
    in_view: Iterable[int],
    *,
    min_score: float = AUTO_RECALL_MIN_SCORE,
    min_terms: int = AUTO_RECALL_MIN_TERMS,
    limit: int = AUTO_RECALL_HITS,
    call_id: str = "auto_recall",
) -> list[Message]:
    """Before a turn: the best BM25 hits for the user's message that score above `min_score`,
    hold `min_terms` of its words and are not already in the model's view, as a synthetic
    recall_history call and its result, so the model reads them as evidence it looked up, not
    as instructions. [] when nothing qualifies."""
    skip = set(in_view)
    strong = [(i, s) for i, s in recall.bm25(text, limit + len(skip)) if s >= min_score]
    strong = [(i, s) for i, s in strong if i not in skip][:limit]
    words = terms(text)
    need = min(min_terms, len(words))
    hits = [h for h in recall._hits(strong, text) if matched_terms(recall.body(h), words) >= need]
    if not hits:
        return []
    call = ToolCall(call_id, "recall_history", {"query": text[:200], "limit": limit})
    result = ToolResult(call_id, "\n".join(h.line() for h in hits))
    return [Message("assistant", [call]), Message("user", [result])]
