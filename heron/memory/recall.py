"""Recall over everything said: SQLite FTS5 (BM25), fused with sentence embeddings when the
`heron[embeddings]` extra is installed.

The full-text index (`messages_fts`, kept in sync by triggers) covers the text of every message
of every conversation, compacted rows included. A question is turned into an OR of its content
words (stop words dropped, each word also matched as a prefix), so a hit needs no exact phrase.
With embeddings, the two scores are blended (BM25 scaled to the best hit, plus cosine
similarity), each message then lends part of its score to its neighbours, and hits that share
a session (same conversation, same day) lift each other: answers cluster where a topic was
discussed.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

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
# Tuned on the LoCoMo dev file (bench/recall.py); each is a broad optimum, not a sharp one.
# Blending scores beat reciprocal-rank fusion there: rank fusion throws away how far ahead a
# clear BM25 winner is.
SEMANTIC_WEIGHT = 1.0  # cosine similarity, added to BM25 divided by the best BM25 score
NEIGHBOUR_SHARE = 0.5  # of a hit's score lent to the messages before and after it
SESSION_SHARE = 0.2  # of the mean of a session's best SESSION_TOP scores added to each hit
SESSION_TOP = 3
MATCH_BUDGET = 6_000  # messages scored per search, at most (see selective_terms)


def wants_recall(text: str) -> bool:
    """Whether a user's message is searched for at all (not empty, not a slash command)."""
    return bool(text.strip()) and not text.lstrip().startswith("/")


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
    seen: dict[str, None] = {}  # ordered, and a large paste stays linear
    for word in _WORD.findall(query.lower()):
        if word not in STOPWORDS and word not in seen and (len(word) > 1 or word.isdigit()):
            seen[word] = None
    return list(seen)


def phrases(query: str, prefix: bool = True) -> list[str]:
    """The quoted FTS5 phrases of a query's terms (quoting makes every word literal, so no
    user text is read as FTS syntax), each also as a prefix when long enough."""
    return [f'"{w}"*' if prefix and len(w) >= 4 else f'"{w}"' for w in terms(query)]


def match_expression(query: str, prefix: bool = True) -> str | None:
    """An FTS5 MATCH expression: an OR of the query's phrases."""
    return " OR ".join(phrases(query, prefix)) or None


# FTS5's bm25 (k1 = 1.2, b = 0.75, unit column weight) gives each phrase of the query
# idf * f * (k1 + 1) / (f + k1 * (1 - b + b * D / avgdl)) for a row: below idf * (k1 + 1).
# idf = log((rows - hits + 0.5) / (hits + 0.5)), floored at 1e-6.
_BM25_TF_CAP = 2.2
_BOUND_SLACK = 1.0  # score bound of the phrases `any_above` may leave out of its first query


def bm25_bound(rows_at_most: int, hits_at_least: int) -> float:
    """An upper bound of what one phrase adds to any row's -bm25 score, from an upper bound of
    the table's rows and a lower bound of the rows that match the phrase."""
    idf = math.log((rows_at_most - hits_at_least + 0.5) / (hits_at_least + 0.5))
    return _BM25_TF_CAP * max(idf, 1e-6)


class Recall:
    def __init__(self, store: Store, embedder: Embedder | None = None) -> None:
        self.store = store
        self.embedder = embedder
        self._vectors: Any = None  # vectors.VectorIndex, made on the first semantic search
        # Message id up to which every message has a vector, per conversation (None: all);
        # looking for missing vectors among 100,000 messages on every search costs 170 ms.
        self._embedded_upto: dict[int | None, int] = {}
        self._encoding: ThreadPoolExecutor | None = None  # encodes queries, made when needed

    def document_frequency(self, word: str, cap: int = MATCH_BUDGET + 1) -> int:
        """How many messages hold `word`, counted up to `cap` (counting further costs time
        and changes nothing)."""
        rows = self.store.query(
            "SELECT count(*) FROM (SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? LIMIT ?)",
            (f'"{word}"', cap),
        )
        return int(rows[0][0])

    def selective_terms(self, query: str, counted: dict[str, int] | None = None) -> list[str]:
        """The query's terms, dropping the most common ones once the rarer ones already match
        MATCH_BUDGET messages: BM25 gives a word found everywhere almost no weight, but scoring
        every message holding it is what makes a search slow on a large history. `counted`,
        if given, receives the counts made (word -> messages holding it, up to the cap)."""
        words = terms(query)
        if len(words) <= 1:
            return words
        frequency = {w: self.document_frequency(w) for w in words}
        if counted is not None:
            counted.update(frequency)
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
        # The same order as FTS5's "ORDER BY rank" (ties by rowid), a third faster at 100,000
        # messages: rank sorts every match, where SQLite keeps only the best `limit` as it goes.
        sql += " ORDER BY s DESC, rowid LIMIT ?"
        params.append(limit)
        return [(r[0], r[1]) for r in self.store.query(sql, params)]

    def any_above(self, query: str, min_score: float) -> bool:
        """Whether `bm25(query)` has a hit scoring at least `min_score`, usually without
        scoring every row that holds a common word: a phrase whose bound (`bm25_bound`) is
        small is left out first; the full search runs only when the answer is then in doubt
        (the rows scored without those phrases lie within their bound of `min_score`)."""
        counted: dict[str, int] = {}
        found = phrases(" ".join(self.selective_terms(query, counted)))
        if not found:
            return False
        known = {f'"{w}"': n for w, n in counted.items()}  # a short word's phrase: counted
        hits = {p: known[p] if p in known else self._rows_matching(p) for p in found}
        found = [p for p in found if hits[p]]  # a phrase no row holds adds nothing to any
        if not found:
            return False
        rows = self.store.query("SELECT coalesce(max(id), 0) FROM messages")[0][0]  # rowid = id
        bounds = {p: bm25_bound(max(rows, hits[p]), hits[p]) for p in found}
        left_out: list[str] = []
        slack = 0.0
        for phrase in sorted(found, key=lambda p: bounds[p]):
            if slack + bounds[phrase] > _BOUND_SLACK:
                break
            left_out.append(phrase)
            slack += bounds[phrase]
        kept = [p for p in found if p not in left_out]
        best = self._best_score(" OR ".join(kept)) if kept else None
        if best is not None and best >= min_score + 1e-9:  # left-out phrases only add
            return True
        if max(best or 0.0, 0.0) + slack < min_score - 1e-9:  # no row can reach it
            return False
        return any(s >= min_score for _, s in self.bm25(query, 3))

    def _rows_matching(self, phrase: str, cap: int = MATCH_BUDGET + 1) -> int:
        rows = self.store.query(
            "SELECT count(*) FROM (SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? LIMIT ?)",
            (phrase, cap),
        )
        return int(rows[0][0])

    def _best_score(self, expr: str) -> float | None:
        rows = self.store.query(
            "SELECT -bm25(messages_fts) FROM messages_fts WHERE messages_fts MATCH ?"
            " ORDER BY rank LIMIT 1",
            (expr,),
        )
        return rows[0][0] if rows else None

    def semantic(
        self, query: str, limit: int = 20, conversation_id: int | None = None
    ) -> list[tuple[int, float]]:
        """(message id, cosine similarity) best first; [] without embeddings."""
        if self.embedder is None:
            return []

        self.index_missing(conversation_id)
        similar = self._similarities(query, conversation_id)
        return list(similar.top(limit).items())

    def _similarities(self, query: str, conversation_id: int | None, vector: Any = None) -> Any:
        from heron.memory import vectors

        assert self.embedder is not None
        if self._vectors is None:
            self._vectors = vectors.VectorIndex(vectors.vector_key(self.embedder))
        return vectors.similarities(
            self.store, self.embedder, query, conversation_id, self._vectors, vector
        )

    def _encoder(self) -> ThreadPoolExecutor:
        if self._encoding is None:
            self._encoding = ThreadPoolExecutor(1, thread_name_prefix="heron-recall")
        return self._encoding

    def index_missing(self, conversation_id: int | None = None) -> int:
        """Embed the messages that have no vector yet (new since the last search)."""
        if self.embedder is None:
            return 0
        from heron.memory import vectors

        upto = self.store.query("SELECT coalesce(max(id), 0) FROM messages")[0][0]
        done = self._embedded_upto
        after = max(done.get(None, 0), done.get(conversation_id, 0))
        count = vectors.index_missing(self.store, self.embedder, conversation_id, after)
        done[conversation_id] = upto
        return count

    def lexical(
        self, query: str, limit: int = 10, conversation_id: int | None = None
    ) -> list[tuple[int, float]]:
        """BM25 with each hit lending part of its score to the messages just before and after
        it: the answer to a question often sits next to the words the question uses."""
        return self.spread(self.bm25(query, max(limit * 5, 100), conversation_id))[:limit]

    def spread(self, ranked: list[tuple[int, float]]) -> list[tuple[int, float]]:
        if not ranked:
            return []
        return lend(dict(ranked), self.neighbours([i for i, _ in ranked]))

    def ranked(
        self, query: str, limit: int = 10, conversation_id: int | None = None
    ) -> list[tuple[int, float]]:
        """Message ids best first: BM25 alone, or blended with the semantic ranking."""
        depth = max(limit * 5, 100)
        if self.embedder is None:
            return self.lexical(query, limit, conversation_id)

        from heron.memory.vectors import encode_query

        # The model encodes the query on one core while SQLite ranks its words on the other
        # (both let go of the GIL): the encoding's 12-25 ms overlap the word ranking's 5-15.
        encoding = self._encoder().submit(encode_query, self.embedder, query)
        lexical = dict(self.bm25(query, depth, conversation_id))
        self.index_missing(conversation_id)
        similar = self._similarities(query, conversation_id, encoding.result())
        # Candidates: the best of either ranking and the messages next to them, which the
        # spreading below can lift; each needs both scores. Neighbours and sessions come
        # from the vectors held in memory when they have every message asked about.
        best = similar.top(depth)
        wanted = [*lexical, *best]
        near = self._vectors.neighbours(wanted)
        if near is None:
            near = self.neighbours(wanted)
        pool = set(lexical) | set(best) | {n for ns in near.values() for n in ns}
        session = self._vectors.sessions(pool)
        if session is None:
            session = self.sessions(pool)
        return blend(lexical, similar.of(pool), near, session)[:limit]

    def neighbours(self, ids: Sequence[int]) -> dict[int, set[int]]:
        """Each message's parent and children among `ids` and around them."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.store.query(
            f"SELECT id, parent_id FROM messages WHERE id IN ({marks}) OR parent_id IN ({marks})",
            [*ids, *ids],
        )
        near: dict[int, set[int]] = {}
        for child, parent in rows:
            if parent is not None:
                near.setdefault(child, set()).add(parent)
                near.setdefault(parent, set()).add(child)
        return near

    def sessions(self, ids: Iterable[int]) -> dict[int, tuple[int, int]]:
        """Message id -> (conversation, day): what counts as one sitting of a conversation."""
        from heron.memory.vectors import DAY  # lazy: vectors loads only when a search ranks

        wanted = list(ids)
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        rows = self.store.query(
            f"SELECT id, conversation_id, created FROM messages WHERE id IN ({marks})", wanted
        )
        return {r[0]: (r[1], int(r[2] // DAY)) for r in rows}

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


def lend(scores: dict[int, float], near: dict[int, set[int]]) -> list[tuple[int, float]]:
    """Each message keeps its score and gets NEIGHBOUR_SHARE of its neighbours' scores."""
    return sorted(_lent(scores, near).items(), key=lambda kv: (-kv[1], kv[0]))


def _lent(scores: dict[int, float], near: dict[int, set[int]]) -> dict[int, float]:
    out = dict(scores)
    for item, score in scores.items():
        others = near.get(item)
        if others:
            share = NEIGHBOUR_SHARE * score
            for other in others:
                out[other] = out.get(other, 0.0) + share
    return out


def blend(
    lexical: dict[int, float],
    semantic: dict[int, float],
    near: dict[int, set[int]],
    session: dict[int, tuple[int, int]],
) -> list[tuple[int, float]]:
    """BM25 scaled to its best hit plus weighted cosine, lent to neighbours, then lifted by
    the strength of the hit's session. A message missing from `lexical` matched no word."""
    best = max(lexical.values(), default=0.0)
    scale = 1.0 / best if best > 0 else 0.0
    pool = set(lexical) | set(semantic)
    base = {i: lexical.get(i, 0.0) * scale + SEMANTIC_WEIGHT * semantic.get(i, 0.0) for i in pool}
    spread = _lent(base, near)
    by_session: dict[tuple[int, int], list[float]] = {}
    for item, score in spread.items():
        by_session.setdefault(session.get(item, (-1, item)), []).append(score)
    lift = {key: _top_mean(scores) for key, scores in by_session.items()}
    final = {
        i: score + SESSION_SHARE * lift[session.get(i, (-1, i))] for i, score in spread.items()
    }
    return sorted(final.items(), key=lambda kv: (-kv[1], kv[0]))


def _top_mean(scores: list[float]) -> float:
    if len(scores) == 1:  # most sessions of a large history hold one candidate
        return scores[0]
    top = sorted(scores)[-SESSION_TOP:]
    return sum(top) / len(top)


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
# with at least two of the query's words in the hit, one in twenty fires. 43.7% of the
# benchmark's questions fire, but only 20.8% bring evidence in (bench/recall.py, one store).
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


# A gate normalised for the history's size: a hit's share of the query's own best score (the
# idf-weighted share of the query's words it holds, idf counted within the conversation), so
# text added to other conversations changes nothing. A candidate for auto-recall, measured by
# bench/recall.py ("auto_gated"); the engine still uses `auto_recall`.
GATED_MIN_SHARE = 0.4
GATED_HITS = 2
GATED_CANDIDATES = 200  # messages of the conversation that hold a query word, at most


def gated_hits(
    recall: Recall,
    text: str,
    conversation_id: int,
    in_view: Iterable[int] = (),
    *,
    min_share: float = GATED_MIN_SHARE,
    limit: int = GATED_HITS,
) -> list[tuple[int, float]]:
    """(message id, share) of the conversation's messages holding at least `min_share` of the
    query's idf weight (and two of its words, all if fewer), best share first, then oldest.
    Exact while fewer than GATED_CANDIDATES messages of the conversation hold a query word."""
    words = terms(text)
    found = recall.bm25(text, GATED_CANDIDATES, conversation_id)
    if not found:
        return []
    # idf among the conversation's messages that hold a query word: what other conversations
    # hold, or how many unrelated messages there are, cannot move it
    total = len(found)
    hits = recall._hits(found, text)
    rows = [(h.message_id, recall.body(h)) for h in hits]
    held = {i: _held(body, words) for i, body in rows}
    df = {w: sum(1 for h in held.values() if w in h) for w in words}
    idf = {w: math.log(1 + (total - df[w] + 0.5) / (df[w] + 0.5)) for w in words}
    whole = sum(idf.values()) or 1.0
    need = min(2, len(words))
    skip = set(in_view)
    scored = [
        (i, sum(idf[w] for w in h) / whole)
        for i, h in held.items()
        if i not in skip and len(h) >= need
    ]
    scored = [(i, s) for i, s in scored if s >= min_share]
    return sorted(scored, key=lambda kv: (-kv[1], kv[0]))[:limit]


def _held(body: str, words: Sequence[str]) -> set[str]:
    tokens = set(_WORD.findall(body.lower()))
    return {
        w for w in words if w in tokens or (len(w) >= 4 and any(t.startswith(w) for t in tokens))
    }
