"""Recall over everything said: SQLite FTS5 (BM25), or PostgreSQL's full-text search (ts_rank over
a tsvector column; heron/memory/records.py), fused with sentence embeddings when the
`heron[embeddings]` extra is installed.

The full-text index (`messages_fts`, kept in sync by triggers) covers the text of every message
of every conversation, compacted rows included. A question is turned into an OR of its content
words (stop words dropped, a long word also matched as a prefix), so a hit needs no exact phrase;
a number or a code matches only whole, and also as a phrase with the word next to it ("item 5"),
which BM25 weighs by its rarity (`search_terms`).
With embeddings, the two scores are blended (BM25 scaled to the best hit, plus cosine
similarity), each message then lends part of its score to its neighbours, and hits that share
a session (same conversation, same day) lift each other: answers cluster where a topic was
discussed.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import itertools
import math
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

from heron import timefmt
from heron.memory import codes, numbers, records, spelling
from heron.memory.days import NamedDays, named_days
from heron.memory.guard import asks_to_forget, overlaps
from heron.memory.retract import takes_back
from heron.memory.stopwords import STOPWORDS
from heron.messages import ToolCall, ToolResult
from heron.store import Store
from heron.store.records import ANSWERED, ASK_TOOL, shown_as
from heron.store.schedule import user_timezone

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Tuned on the LoCoMo dev file (bench/recall.py); each is a broad optimum, not a sharp one.
# Blending scores beat reciprocal-rank fusion there: rank fusion throws away how far ahead a
# clear BM25 winner is.
SEMANTIC_WEIGHT = 1.0  # cosine similarity, added to BM25 divided by the best BM25 score
NEIGHBOUR_SHARE = 0.5  # of a hit's score lent to the messages before and after it
SESSION_SHARE = 0.2  # of the mean of a session's best SESSION_TOP scores added to each hit
SESSION_TOP = 3
MATCH_BUDGET = 6_000  # messages scored per search, at most (see selective_terms)
BM25_KEPT = 4  # searches `Recall.bm25` keeps until the database changes
PREFIX_MIN = 4  # letters from which a query word also matches as a word's start
# Matches `found_elsewhere` looks through for one of another conversation: a word matched this
# often is taken as found there (a rarer word is looked at whole, and it is rare words that a
# conversation holds alone).
ELSEWHERE_CAP = 1_000
# Messages of a conversation, at most, that a search of the others drops by their ids from a
# longer plain ranking when the conversation's own search was not made (`Recall._outside`).
SMALL_SCOPE = 1_000
# A query's `Cue` lifts, among the first CUE_DEPTH of its ranking, the messages that can
# answer it, each by a share of the best score: for a question about time, those that state a
# time (WHEN_WEIGHT) and those written in the month or year it names (DATE_WEIGHT); for a
# question naming a person, the lines that person said (SPEAKER_WEIGHT). Chosen by the k-fold
# check (bench/recall.py --folds, docs/memory.md gives every fold's choice).
CUE_DEPTH = 100
# How deep the ranking of a dated query's other words is read for the day's messages to keep
# its order (`Recall.day_ranking`): the depth the cue reorders, so no choice of its own.
DAY_DEPTH = CUE_DEPTH
WHEN_WEIGHT = 0.1
DATE_WEIGHT = 0.2
SPEAKER_WEIGHT = 0.2


_MONTHS: tuple[str, ...] = ("january", "february", "march", "april", "may", "june", "july")
_MONTHS += ("august", "september", "october", "november", "december")
_MONTH = re.compile(r"\b(" + "|".join(_MONTHS) + r")\b", re.IGNORECASE)
_YEAR = re.compile(r"\b((?:19|20)\d\d)\b")
# A question that asks for a time: its answer is a time the message states.
_ASKS_WHEN = re.compile(
    r"^\W*(when|how long ago|(what|which) (date|day|month|year|time))\b", re.IGNORECASE
)
# What a message that states a time holds: a day relative to its own date, a unit of time
# ("last week", "two years ago"), a weekday, a month, a year, a day of the month ("the 14th")
# or a clock time ("9:30", "9am", "9.30 p.m.", "noon").
_STATES_TIME = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|ago|last|next|recently|weekend|week|month|year"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday|"
    + "|".join(_MONTHS)
    + r"|(19|20)\d\d"
    + r"|(0?[1-9]|[12]\d|3[01])(st|nd|rd|th)"
    + r"|([01]?\d|2[0-3]):[0-5]\d"
    + r"|(0?[1-9]|1[0-2])([.:][0-5]\d)?\s?[ap]\.?m\.?|noon|midnight|o'clock)(?!\w)",
    re.IGNORECASE,
)


# A transcript line: a name of up to four capitalised words, a colon ("Caroline: I went ...").
_SPEAKER = re.compile(r"\s*([A-Z][^\W_]*(?:[ .'-]+[A-Z][^\W_]*){0,3}):\s")
_NAME = re.compile(r"\b[A-Z][^\W_]*")


def speaker_of(text: str) -> str | None:
    """Who says a message, when its text is a transcript line that opens with the speaker's
    name (chat logs, group messages, the benchmark's stored LoCoMo turns); None otherwise."""
    found = _SPEAKER.match(text)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Cue:
    """What a query says beyond its words: whether it asks when, the months and years it names
    (a question about "June" or "October 13, 2023" is about what was said then), and the
    capitalised words that may name a speaker ("What did Caroline research?"), lowercased."""

    asks_when: bool
    months: frozenset[int]
    years: frozenset[int]
    names: frozenset[str] = frozenset()

    def most(self) -> float:
        """The largest lift this cue can give a message, as a share of the best score."""
        return (
            (WHEN_WEIGHT if self.asks_when else 0.0)
            + (DATE_WEIGHT if self.months or self.years else 0.0)
            + (SPEAKER_WEIGHT if self.names else 0.0)
        )

    def said_by(self, text: str) -> bool:
        """Whether `text` is a line of a speaker this cue names (any word of the name)."""
        speaker = speaker_of(text)
        return speaker is not None and any(w.lower() in self.names for w in _WORD.findall(speaker))

    def dates(self, created: float, zone: str) -> bool:
        """Whether a message written at `created` falls in the months and years named, read in
        the agent's `zone`, as hits show it."""
        when = timefmt.local_date(created, zone)
        return (not self.months or when.month in self.months) and (
            not self.years or when.year in self.years
        )


def query_cue(query: str) -> Cue | None:
    """The query's `Cue`, or None when it says nothing about time and names no one."""
    # "may" is a month only as "May": lowercase, it is far more often the verb
    named = [m for m in _MONTH.findall(query) if m.lower() != "may" or m == "May"]
    months = frozenset(_MONTHS.index(m.lower()) + 1 for m in named)
    years = frozenset(int(y) for y in _YEAR.findall(query))
    asks = bool(_ASKS_WHEN.search(query))
    # a month is a date, not a speaker; a capitalised stop word opens the question
    names = frozenset(
        w.lower()
        for w in _NAME.findall(query)
        if w.lower() not in STOPWORDS and w.lower() not in _MONTHS
    )
    return Cue(asks, months, years, names) if asks or months or years or names else None


def asks(text: str) -> bool:
    """Whether a message asks something (holds a "?"), as auto-recall's `Gate.answers` reads it."""
    return "?" in text


# An ASCII text's bytes with every one that is not a letter or a digit made a space: `_WORD`'s
# characters, for ASCII, are exactly those.
_ASCII_WORDS = bytes(c if chr(c).isalnum() and c < 128 else 32 for c in range(256))


def same_text(text: str) -> str:
    """What two messages that say the same thing have alike: their words, lowercased, without
    the spacing and punctuation between them ("" for a text of no word). An ASCII text (most
    are) is split by a byte table, three times faster than the pattern: a ranking folds each
    of a hundred or more texts it reads (`Recall.distinct`)."""
    if text.isascii():
        return " ".join(text.lower().encode().translate(_ASCII_WORDS).decode().split())
    return " ".join(_WORD.findall(text.lower()))


def said_again(body: str, words: Sequence[str]) -> bool:
    """Whether a text found twice in a ranking is left out of it (`Recall.distinct`): it holds
    none of the query's `words`, so each copy is there on its neighbour's score, not its own;
    a query of no word keeps it (nothing to hold)."""
    return bool(words) and not held_terms(body, words)


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
    # user | model | tool | heron (heron/store/records.py `author_for`); None: not known.
    author: str | None = None
    zone: str = "UTC"  # the agent's, which `line` dates it in (the Recall's that found it)
    # Not on its conversation's current branch (an answer /retry replaced, the old text of an
    # /edit, a branch /tree left): only a search of the record (`standing=False`) shows one.
    elsewhere: bool = False
    # What the person said later in the same conversation taking this back (`corrections`).
    later: Hit | None = None
    # Messages of the search's ranking that say the same text (`same_text`), this one the
    # newest of them: a question asked again and again is one hit, not the whole page.
    times: int = 1

    @property
    def typed(self) -> bool:
        """Whether the person wrote it (not Heron, the model, nor a tool)."""
        return self.role == "user" and self.author in (None, "user")

    @property
    def speaker(self) -> str:
        """Who said it, as the model is told: its role, or "heron" for a row Heron wrote (a
        reminder's prompt, what a monitor told the person), whatever its role: never the
        person's words ("user") nor the model's own answer."""
        return spoken_by(self.role, self.author)

    @property
    def who(self) -> str:
        """Who said it, as `heron conversations show` names rows: you, assistant or heron."""
        return shown_as(self.role, self.author)

    def line(self, who: str | None = None) -> str:
        """`[key · date · message id · who] snippet`; `who` is `speaker` unless given (the
        model reads these lines: recall_history, auto-recall)."""
        text = " ".join(self.snippet.split())
        said = who or self.speaker
        where = " · on another branch" if self.elsewhere else ""
        if self.times > 1:
            where += f" · {'asked' if asks(self.snippet) else 'said'} {self.times} times"
        key, zone = self.conversation_key, self.zone
        return f"{heading(key, self.created, zone, self.message_id, said + where)} {text}"

    def lines(self, who: str | None = None) -> list[str]:
        """`line`, and under it the correction the person made later, if any."""
        if self.later is None:
            return [self.line(who)]
        return [self.line(who), LATER + self.later.line(who)]


def spoken_by(role: str, author: str | None) -> str:
    """Who said a row, as the model is told (`Hit.speaker`)."""
    return "heron" if author == "heron" else role


def heading(key: str, created: float, zone: str, message_id: int, who: str) -> str:
    """`[key · date · message id · who]`: where and when a message was said, as a hit and a
    message opened by its id (recall_history) both begin."""
    return f"[{key} · {timefmt.when(created, zone)} · message {message_id} · {who}]"


# What introduces, under a hit, the person's later words that take it back.
LATER = "  ↳ later: "


class Embedder(Protocol):
    name: str

    def encode(self, texts: Sequence[str]) -> list[list[float]]: ...


# Queries whose words are kept worked out (`terms`, `search_terms`): one turn's auto-recall
# asks them of the same text a dozen times, in each of its searches and checks.
QUERIES_KEPT = 32


def terms(query: str) -> list[str]:
    """The content words of a query, lowercased, in order, without repeats. A code that the
    tokenizer splits ("QX-99812", "v2.3.1", "10:30": a run of letters and digits without a
    space that holds a digit) is one term, as typed: it matches as a whole (a phrase of its
    parts on FTS5; PostgreSQL's parser reads it as it read the messages, "v2.3.1" one word),
    where its parts alone ("v2", "3", "1") are in countless messages."""
    return list(_terms(query))


@functools.lru_cache(maxsize=QUERIES_KEPT)
def _terms(query: str) -> tuple[str, ...]:
    seen: dict[str, None] = {}  # ordered, and a large paste stays linear
    for chunk in _chunks(query):
        if len(chunk.words) > 1 and chunk.numeric:
            seen.setdefault(chunk.text, None)
            continue
        for word in chunk.words:
            if word not in STOPWORDS and (len(word) > 1 or word.isdigit()):
                seen.setdefault(word, None)
    return tuple(seen)


def search_terms(query: str) -> list[str]:
    """What a search matches: the query's `terms`, then each number or code together with a
    content word right next to it in the same clause ("item 5", "ticket 4711", "PR #88", "5
    years"). Most messages that hold a small number hold it about something else; the one
    that says it next to the word the question says it with is the one asked about, and as
    a phrase it weighs in BM25 as the rare thing it is (a phrase no message holds adds
    nothing to any score)."""
    return list(_search_terms(query))


@functools.lru_cache(maxsize=QUERIES_KEPT)
def _search_terms(query: str) -> tuple[str, ...]:
    found = dict.fromkeys(_terms(query))
    chunks = _chunks(query)
    for before, after in itertools.pairwise(chunks):
        # a clause's punctuation between them parts them
        if before.numeric == after.numeric or _CLAUSE.search(after.gap):
            continue
        word = after.words[0] if before.numeric else before.words[-1]
        if word in STOPWORDS or len(word) < 2:
            continue
        pair = f"{before.text} {word}" if before.numeric else f"{word} {after.text}"
        found.setdefault(pair, None)
    return tuple(found)


@dataclass(frozen=True)
class _Chunk:
    """A run of a query's words with no space between them ("qx-99812" is two words, one
    chunk): its words, its text from the first to the last, the text between it and the
    chunk before, and whether a word of it holds a digit."""

    words: tuple[str, ...]
    text: str
    gap: str
    numeric: bool


# What ends a clause between two chunks: a number is not paired with a word across it
# ("item 5? Something" says nothing of "5 something").
_CLAUSE = re.compile(r"[.,;:!?()\[\]{}\"\u2026]")
# What parts two chunks besides white space: the quotes and the backslash that FTS5's and
# PostgreSQL's query syntax read (a code never holds them, so a term needs no escaping).
_APART = frozenset("\"'\\")


def _chunks(query: str) -> list[_Chunk]:
    """The query's words, lowercased, in chunks."""
    lower = query.lower()
    out: list[_Chunk] = []
    words: list[str] = []
    start = end = 0
    gap = ""
    for found in _WORD.finditer(lower):
        between = lower[end : found.start()]
        if words and not any(c.isspace() or c in _APART for c in between):
            words.append(found.group())
        else:
            if words:
                out.append(_Chunk(tuple(words), lower[start:end], gap, _numeric(words)))
            words, start, gap = [found.group()], found.start(), between
        end = found.end()
    if words:
        out.append(_Chunk(tuple(words), lower[start:end], gap, _numeric(words)))
    return _spaced_numbers(out)


# Between the groups of a number written with spaces ("48 250"): one space of any width, or
# the apostrophe (Swiss: 48'250), which parts chunks (`_APART`).
_GROUP_SPACE = frozenset(" \u00a0\u202f\u2009'")


def _spaced_numbers(chunks: list[_Chunk]) -> list[_Chunk]:
    """`chunks` with a number grouped by spaces ("48 250", "1 000 000", "48'250") as one
    chunk, written with commas ("48,250"), which `numbers` reads as the number: its groups
    alone ("48", "250") are numbers of their own that countless messages hold."""
    out: list[_Chunk] = []
    for chunk in chunks:
        last = out[-1] if out else None
        if (
            last is not None
            and len(chunk.words) == 1
            and len(chunk.gap) == 1
            and chunk.gap in _GROUP_SPACE
            and re.fullmatch(r"\d{3}", chunk.words[0])
            and re.fullmatch(r"[1-9]\d{0,2}(,\d{3})*", last.text)
        ):
            words = (*last.words, chunk.words[0])
            out[-1] = _Chunk(words, ",".join(words), last.gap, True)
        else:
            out.append(chunk)
    return out


def _numeric(words: Iterable[str]) -> bool:
    return any(c.isdigit() for w in words for c in w)


def phrase(word: str, prefix: bool = True) -> str:
    """One term's FTS5 phrase, as `match_expression` searches it: a word of PREFIX_MIN
    letters or more also as the start of a longer one; a number, a code or words together
    only whole ("4711" is not "47110"). A number of 1,000 or more is searched in each of its
    groupings ("48250" OR "48,250": `numbers.fts_forms`), by itself or in a phrase, and a code
    in each spelling of its seams ("qx99812" OR "qx 99812": `codes.fts_forms`)."""
    if prefix and _prefixed(word):
        return f'"{word}"*'
    forms = codes.fts_forms(word)
    if len(forms) == 1:
        return f'"{word}"'
    return "(" + " OR ".join(f'"{f}"' for f in forms) + ")"


def phrases(words: Sequence[str]) -> str:
    """An FTS5 OR of the phrase of `words` (in their order) in each grouping of its numbers
    and spelling of its codes: what a message that says them verbatim matches."""
    return " OR ".join(f'"{f}"' for f in codes.fts_forms(" ".join(words)))


def phrase_words(query: str) -> list[str]:
    """The query's words in order, a grouped number one word ("48,250", "48 250"), as
    `verbatim` and `exact` match them."""
    out: list[str] = []
    for chunk in _chunks(query):
        if numbers.digits(chunk.text) is not None:
            out.append(chunk.text)
        else:
            out.extend(chunk.words)
    return out


def _prefixed(word: str) -> bool:
    return len(word) >= PREFIX_MIN and _plain(word) and not _numeric([word])


def _plain(word: str) -> bool:
    """Whether a term is one word (not a code nor words together)."""
    return _WORD.fullmatch(word) is not None


def expression(words: Sequence[str], prefix: bool = True) -> str | None:
    """An FTS5 MATCH expression: an OR of the phrases of the terms `words` (quoting makes every
    word literal, so no user text is read as FTS syntax)."""
    return " OR ".join(phrase(w, prefix) for w in words) or None


def match_expression(query: str, prefix: bool = True) -> str | None:
    """An FTS5 MATCH expression: an OR of the phrases of the query's `search_terms`."""
    return expression(search_terms(query), prefix)


@dataclass
class _Chain:
    """Whether each message asked about is on the branch to `head` of a conversation made at
    `created` (`Recall.on_branch`)."""

    head: int
    created: float
    answers: dict[int, bool] = dataclasses.field(default_factory=dict)


CHAINS_KEPT = 64  # conversations whose answers `Recall.on_branch` keeps


@dataclass
class _Look:
    """What one look (`Recall.one_look`) of one Recall read once: the database's stamp, as
    its first search read it, and the messages' indexed text, which its searches and checks
    ask of the same messages again (the candidates of its gate, then of its fused order)."""

    stamp: tuple[int, int]
    bodies: dict[int, str | None] = dataclasses.field(default_factory=dict)


# Per Recall (by id) in the look being made, if any.
_LOOK: ContextVar[dict[int, _Look] | None] = ContextVar("heron_recall_look", default=None)


class Hits(list[Hit]):
    """A search's hits, best first, and `forgotten`: how many messages that matched were left
    out because they state what the person asked to forget since (`Recall.revoked`)."""

    def __init__(self, hits: Iterable[Hit] = (), forgotten: int = 0) -> None:
        super().__init__(hits)
        self.forgotten = forgotten

    def forgotten_note(self, whom: str, more: str = "") -> str | None:
        """The line that says so, `whom` the person ("you", "the person"), `more` said at its
        end; None: none was."""
        if not self.forgotten:
            return None
        n = self.forgotten
        return (
            f"({n} more message{'s' if n > 1 else ''} matched but {'are' if n > 1 else 'is'} "
            f"not shown: {'they say' if n > 1 else 'it says'} something {whom} asked memory to "
            f"forget, among what else was said there{more}.)"
        )


class Recall:
    def __init__(
        self,
        store: Store,
        embedder: Embedder | None = None,
        zone: str | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.embedder = embedder
        # The agent's zone (`Settings.timezone`): the dates of hits and of a query's days,
        # months and years are read in it; None: the system's, as `[agent] timezone` unset
        # gives.
        self.zone = zone or user_timezone(None)
        self.now = now  # what "yesterday" and "last Tuesday" are read from
        self._vectors: Any = None  # vectors.VectorIndex, made on the first semantic search
        # Message id up to which every message has a vector, per conversation (None: all);
        # looking for missing vectors among 100,000 messages on every search costs 170 ms.
        self._embedded_upto: dict[int | None, int] = {}
        # The last search found more messages without a vector than it embeds itself
        # (`index_missing`): its semantic half covered only the messages embedded so far.
        self.behind = False
        self._encoding: ThreadPoolExecutor | None = None  # encodes queries, made when needed
        self._last_query: tuple[str, Future[Any]] | None = None
        # The last query's counts (`frequencies`): term -> (count, the cap it was counted to)
        self._counted: tuple[str, tuple[int, int], dict[str, tuple[int, int]]] | None = None
        # Conversation -> what `on_branch` found of its branch, kept while its head stays:
        # the other conversations a person's hits come from seldom move.
        self._chains: OrderedDict[int, _Chain] = OrderedDict()
        # (query, conversation, outside, budget) -> (database stamp, limit, hits): see `bm25`
        self._bm25_kept: dict[
            tuple[str, int | None, int | None, int],
            tuple[tuple[int, int], int, list[tuple[int, float]]],
        ] = {}

    def document_frequency(self, word: str, cap: int = MATCH_BUDGET + 1) -> int:
        """How many messages hold `word`, counted up to `cap` (counting further costs time
        and changes nothing)."""
        return records.rows_matching(self.store, phrase(word, prefix=False), cap)

    def found_elsewhere(
        self, query: str, conversation_id: int, counted: int = 0, also: Sequence[str] = ()
    ) -> list[str]:
        """The query's terms (and those of its search terms named in `also`) the index finds
        (as a search matches them) in a message of another conversation. A term in more
        messages than the conversation holds is, without a look; one matched ELSEWHERE_CAP
        times or more counts as found. `counted`: how far the caller's next search counts the
        terms anyway (its budget), so that they are counted once."""
        words = [*terms(query), *also]
        size = records.conversation_size(self.store, conversation_id, MATCH_BUDGET + 1)
        frequency = self.frequencies(query, max(size, counted))
        return [
            w
            for w in words
            # a count of the plain word is at most its count as a prefix: one over `size`
            # (both capped alike) is a message outside the conversation
            if frequency[w] > size
            or records.matches_elsewhere(self.store, phrase(w), conversation_id, ELSEWHERE_CAP)
        ]

    def respelled(self, query: str) -> tuple[str, list[tuple[str, str]]]:
        """`query` with each word that no message holds (as the search matches it) replaced by
        the nearest word the history holds (`spelling.allowance` edits at most, compared as the
        index keeps words: "caroleine" as "carolein", near "carolin"), and the (typed,
        searched) pairs. For the searches a person or the model asks for; auto-recall never
        respells. Reads the index's whole vocabulary, only when a word is missing."""
        missing = {
            w: most
            for w in terms(query)
            if (most := spelling.allowance(w))
            and records.rows_matching(self.store, phrase(w), 1) == 0
        }
        if not missing:
            return query, []
        kept = records.stems(self.store, list(missing))
        stems = {w: kept[w] for w in missing if w in kept}
        if not stems:
            return query, []
        shortest = min(len(s) - missing[w] for w, s in stems.items())
        longest = max(len(s) + missing[w] for w, s in stems.items())
        vocabulary = records.vocabulary(self.store, shortest, longest)
        respelled = []
        for typed, stem in stems.items():
            near = spelling.nearest(stem, vocabulary, missing[typed])
            if near is not None:
                word = self._written(near)
                query = spelling.replace(query, typed, word)
                respelled.append((typed, word))
        return query, respelled

    def _written(self, stem: str) -> str:
        """How messages write a word the index keeps as `stem`: its commonest form in the
        best few messages that hold it ("carolin": "caroline"); the stem if none is found."""
        ids = [i for i, _ in records.bm25_ranked(self.store, f'"{stem}"', WRITTEN_LOOK)]
        bodies = records.indexed_text(self.store, ids).values()
        words = [w for body in bodies for w in _WORD.findall(body.lower())]
        kept = records.stems(self.store, sorted(set(words)))
        forms = Counter(w for w in words if kept.get(w) == stem)
        return forms.most_common(1)[0][0] if forms else stem

    def frequencies(self, query: str, upto: int = MATCH_BUDGET) -> dict[str, int]:
        """`document_frequency` of each of the query's search terms, exact up to `upto` (a
        larger count says only that it is larger: counting the matches of a common word is
        what costs, and a caller needs no more than its bound). The last query's counts are
        kept until the database changes (each search of one turn's auto-recall asks them),
        and a count is made again only when a caller needs it exact further than it was.
        A number with its word ("item 5") is counted too, not bounded by its words' counts:
        those can be large where the phrase is rare, and `selective_terms` would drop it."""
        stamp = self._stamp()
        kept: dict[str, tuple[int, int]] = {}
        if self._counted is not None and self._counted[:2] == (query, stamp):
            kept = self._counted[2]
        cap = min(upto, MATCH_BUDGET) + 1
        for word in search_terms(query):
            count, counted_to = kept.get(word, (0, 0))
            if count >= counted_to and counted_to < cap:  # not known exact as far as asked
                kept[word] = (self.document_frequency(word, cap), cap)
        self._counted = (query, stamp, kept)
        return {w: count for w, (count, _) in kept.items()}

    def selective_terms(self, query: str, budget: int = MATCH_BUDGET) -> list[str]:
        """The query's terms, dropping the most common ones once the rarer ones already match
        `budget` messages: BM25 gives a word found everywhere almost no weight, but scoring
        every message holding it is what makes a search slow on a large history."""
        words = search_terms(query)
        if len(words) <= 1:
            return words
        frequency = self.frequencies(query, budget)
        if min(frequency.values()) > budget:  # only the rarest is kept: told apart further
            frequency = self.frequencies(query)
        kept: list[str] = []
        total = 0
        for word in sorted(words, key=lambda w: frequency[w]):
            df = frequency[word]
            if kept and total + df > budget:
                break
            kept.append(word)
            total += df
        return [w for w in words if w in kept]

    def bm25(
        self,
        query: str,
        limit: int = 20,
        conversation_id: int | None = None,
        *,
        outside: int | None = None,
        budget: int = MATCH_BUDGET,
    ) -> list[tuple[int, float]]:
        """(message id, score) best first; score is -bm25, so higher is better. Within one
        conversation, or with `outside`, in every conversation but that one; the words
        searched are `selective_terms(query, budget)`. A `budget` under MATCH_BUDGET (auto-
        recall's search of other conversations) also bounds what an unscoped search scores:
        the newest `budget` matches of the index, so a turn's cost stays bounded when even
        the rarest word is in tens of thousands of messages (a conversation's own search
        is cheap and never bounded).

        The last few searches are kept until the database changes: auto-recall asks the same
        words of the same scope for its gate and again for the fused order (a shorter list of
        a search is the start of a longer one: the order is total, by score then id)."""
        if outside is not None and conversation_id is None:
            return self._outside(query, limit, outside, budget)
        return self._search(query, limit, conversation_id, outside, budget)

    def _search(
        self,
        query: str,
        limit: int,
        conversation_id: int | None,
        outside: int | None,
        budget: int,
    ) -> list[tuple[int, float]]:
        """One FTS5 ranking for `bm25`, or the kept one."""
        key = (query, conversation_id, outside, budget)
        kept = self._kept(key, limit)
        if kept is not None:
            return kept
        expr = expression(self.selective_terms(query, budget))
        newest = budget if budget < MATCH_BUDGET and conversation_id is None else None
        found = (
            []
            if expr is None
            else records.bm25_ranked(self.store, expr, limit, conversation_id, outside, newest)
        )
        if len(self._bm25_kept) >= BM25_KEPT:
            self._bm25_kept.pop(next(iter(self._bm25_kept)))
        self._bm25_kept[key] = (self._stamp(), limit, found)
        return found

    def _outside(
        self, query: str, limit: int, conversation_id: int, budget: int
    ) -> list[tuple[int, float]]:
        """`bm25(outside=conversation_id)`: the plain ranking without the conversation's
        messages, one scoring of every match, which auto-recall's ranking of every
        conversation then reuses, instead of two; or, when the conversation holds too many
        matches to drop, the ranking filtered as it is made.

        The conversation's matches are those of its own search at the full budget when
        auto-recall has just made it (kept): a smaller budget keeps a subset of the same
        words (the rarest first), so its matches are among them, and dropping them all is
        exact. When it skipped that search (nothing of the conversation could be shown) and
        the conversation is small, the plain ranking is made `size` longer, since at most
        `size` of it can be the conversation's, and those are found by their ids."""
        full = max(budget, MATCH_BUDGET)
        mine = self._kept((query, conversation_id, None, full), limit)
        if mine is None:
            size = records.conversation_size(self.store, conversation_id, SMALL_SCOPE + 1)
            if size <= SMALL_SCOPE:
                ranked = self.bm25(query, limit + size, budget=budget)
                theirs = records.of_conversation(
                    self.store, [i for i, _ in ranked], conversation_id
                )
                return [(i, s) for i, s in ranked if i not in theirs][:limit]
            mine = self.bm25(query, limit, conversation_id, budget=full)
        if len(mine) < limit:
            skip = {i for i, _ in mine}
            ranked = self.bm25(query, limit + len(mine), budget=budget)
            return [(i, s) for i, s in ranked if i not in skip][:limit]
        return self._search(query, limit, None, conversation_id, budget)

    def _kept(
        self, key: tuple[str, int | None, int | None, int], limit: int
    ) -> list[tuple[int, float]] | None:
        """A kept search's first `limit` hits, if it was made since the database last changed
        with at least that limit."""
        kept = self._bm25_kept.get(key)
        if kept is None or kept[1] < limit or kept[0] != self._stamp():
            return None
        return kept[2][:limit]

    def _stamp(self) -> tuple[int, int]:
        """Changes when anything was written, by this connection or another. Read once per
        look (`one_look`)."""
        look = self._look()
        return records.write_stamp(self.store) if look is None else look.stamp

    def _look(self) -> _Look | None:
        """This Recall's part of the look being made (its stamp read at the first ask)."""
        looks = _LOOK.get()
        if looks is None:
            return None
        look = looks.get(id(self))
        if look is None:
            look = looks[id(self)] = _Look(records.write_stamp(self.store))
        return look

    @contextmanager
    def one_look(self) -> Iterator[None]:
        """The searches inside (one auto-recall check: its gate's searches, the fused order,
        the hits) read the database's stamp once, as if at the first: each read is a round
        trip on PostgreSQL, and the check reads what was committed when it began."""
        if _LOOK.get() is not None:
            yield
            return
        token = _LOOK.set({})
        try:
            yield
        finally:
            _LOOK.reset(token)

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
        """Embed the messages that have no vector yet (new since the last search), the oldest
        `vectors.INLINE_MOST` of a backlog: `behind` then says more are left, and the search
        ranks with the vectors there are (`heron memory index` fills the rest)."""
        if self.embedder is None:
            return 0
        from heron.memory import vectors

        upto = records.max_message_id(self.store)
        done = self._embedded_upto
        after = max(done.get(None, 0), done.get(conversation_id, 0))
        count, stopped = vectors.index_missing(
            self.store, self.embedder, conversation_id, after, vectors.INLINE_MOST
        )
        self.behind = stopped is not None
        done[conversation_id] = upto if stopped is None else stopped
        return count

    def spread(self, ranked: list[tuple[int, float]]) -> list[tuple[int, float]]:
        if not ranked:
            return []
        return lend(dict(ranked), self.neighbours([i for i, _ in ranked]))

    def ranked(
        self,
        query: str,
        limit: int = 10,
        conversation_id: int | None = None,
        budget: int = MATCH_BUDGET,
        *,
        by_day: bool = True,
    ) -> list[tuple[int, float]]:
        """Message ids best first: BM25 alone (its words chosen within `budget`, see
        `selective_terms`), or blended with the semantic ranking. Messages that say the same
        text are one (`distinct`), and a message that asks follows one that tells the words it
        holds (`told_first`). `by_day`: a day the query names selects the messages written
        that day (`day_ranking`); auto-recall reads no day (docs/memory.md says why)."""
        return self.ranking(query, limit, conversation_id, budget, by_day=by_day)[0]

    def today(self) -> date:
        """The person's date now, in the agent's zone."""
        return timefmt.local_date(self.now(), self.zone)

    def days_named(self, query: str) -> list[date]:
        """The days `query` names, oldest first (`days.named_days`)."""
        return sorted(named_days(query, self.today()).days)

    def ranking(
        self,
        query: str,
        limit: int = 10,
        conversation_id: int | None = None,
        budget: int = MATCH_BUDGET,
        *,
        by_day: bool = True,
    ) -> tuple[list[tuple[int, float]], dict[int, int]]:
        """`ranked`, and for each message that stands for others of the same text, how many
        they are (itself included)."""
        if by_day:
            named = named_days(query, self.today())
            if named.days:
                return self.day_ranking(named, limit, conversation_id, budget)
        cue = query_cue(query)
        head = max(limit, CUE_DEPTH) if cue else limit  # what the query's cue reorders
        with self.one_look():  # the texts `distinct`, `told_first` and the lifts read, once
            found = self._scored(query, conversation_id, budget, max(limit * 5, 100))
            kept, times = self.distinct(found, head, query)
            kept = self.told_first(query, kept)
            return self._lifted(cue, kept, limit), times

    def day_ranking(
        self, named: NamedDays, limit: int, conversation_id: int | None, budget: int
    ) -> tuple[list[tuple[int, float]], dict[int, int]]:
        """`ranking` for a query that names days: the messages written on them that hold its
        other words first, by their BM25 scores, then the ranking of those words over every
        day (what the person may misremember the day of). A query with no other word than
        the day's and words that ask for what was said ("what did I say last Tuesday") lists
        the person's own messages of those days, oldest first."""
        spans = self._spans(named)
        if lists_the_day(named):
            ids = records.typed_within(self.store, spans, conversation_id, limit)
            return [(i, float(len(ids) - k)) for k, i in enumerate(ids)], {}
        with self.one_look():
            expr = expression(self.selective_terms(named.rest, budget))
            depth = max(limit * 5, 100)
            found = (
                []
                if expr is None
                else records.bm25_ranked(self.store, expr, depth, conversation_id, within=spans)
            )
            that_day, times = self.distinct(found, limit, named.rest)
            that_day = self.told_first(named.rest, that_day)
            depth = max(limit, DAY_DEPTH)
            others, more = self.ranking(named.rest, depth, conversation_id, budget, by_day=False)
        # The day's messages above every other. Among them the order is the one every search
        # has (fused with the vectors when they are on), not BM25's alone: a day narrows where
        # to look, it says nothing of which of that day's messages answers best. The day's
        # messages the ranking did not reach follow, in BM25's order.
        on_day = {i for i, _ in found}
        ranked_ids = {i for i, _ in others}
        day_order = [i for i, _ in others if i in on_day]
        day_order += [i for i, _ in that_day if i not in ranked_ids]
        above = max((s for _, s in others), default=0.0)
        first = [(i, above + len(day_order) - k) for k, i in enumerate(day_order)]
        rest = [(i, s) for i, s in others if i not in on_day]
        return [*first, *rest][:limit], {**more, **times}

    def _spans(self, named: NamedDays) -> list[tuple[float, float]]:
        """The days named, as spans of time in the agent's zone, oldest first."""
        return [timefmt.day_bounds(d, self.zone) for d in sorted(named.days)]

    def day_listing(self, query: str, conversation_id: int | None = None) -> DayListing | None:
        """For a query that lists the person's messages of the days it names (`day_ranking`),
        the days and how many messages they wrote then, in the scope searched: a listing
        shows the first of them only, and says how many there are (`DayListing.note`)."""
        named = named_days(query, self.today())
        if not named.days or not lists_the_day(named):
            return None
        total = records.count_typed_within(self.store, self._spans(named), conversation_id)
        return DayListing(tuple(sorted(named.days)), total)

    def _scored(
        self, query: str, conversation_id: int | None, budget: int, depth: int
    ) -> list[tuple[int, float]]:
        """Every candidate of the ranking, best first, before its cue's lifts: the first
        `depth` of BM25 lending to their neighbours, or that blended with the semantic
        ranking's first `depth`."""
        if self.embedder is None:
            return self.spread(self.bm25(query, depth, conversation_id, budget=budget))

        # The model encodes the query on one core while SQLite ranks its words on the other
        # (both let go of the GIL): the encoding's 12-25 ms overlap the word ranking's 5-15.
        encoding = self._query_vector(query)
        lexical = dict(self.bm25(query, depth, conversation_id, budget=budget))
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
        return blend(lexical, similar.of(pool), near, session)

    def distinct(
        self, ranked: list[tuple[int, float]], want: int, query: str = ""
    ) -> tuple[list[tuple[int, float]], dict[int, int]]:
        """The first `want` (or a few more) of `ranked` with the messages that say the same
        text (`same_text`) as one: the newest of them, in the place and with the score of the
        best, and how many they are. A question asked again and again otherwise fills every
        place, and the message that answers it finds none. A text said again that holds none
        of `query`'s words is left out, every copy of it: each came in on the score its own
        neighbour lent it, and a text said in many places ("ok", "thanks") tells nothing of
        any of them (`said_again`). Texts are read only as far down the ranking as `want`
        different ones go."""
        out: list[tuple[int, float] | None] = []  # None: a text said again, left out
        place: dict[str, int] = {}  # a text -> its place in `out`
        times: dict[int, int] = {}
        words = search_terms(query)
        folded: dict[str, str] = {}  # a body -> its `same_text`
        kept_on: dict[str, bool] = {}  # a text found twice -> whether it stays
        kept = at = 0
        while kept < want and at < len(ranked):
            chunk = ranked[at : at + max(want - kept, DISTINCT_READ)]
            at += len(chunk)
            bodies = self.bodies([i for i, _ in chunk])
            for i, score in chunk:
                body = bodies.get(i, "")
                text = folded.get(body)
                if text is None:  # copies are mostly written alike: one fold for all
                    text = folded[body] = same_text(body)
                if not text or text not in place:  # a message of no word stands alone
                    if text:
                        place[text] = len(out)
                    out.append((i, score))
                    kept += 1
                    continue
                copy = out[place[text]]
                if copy is None:
                    continue
                if text not in kept_on:  # copies say the same words: one look for all
                    kept_on[text] = not said_again(body, words)
                if not kept_on[text]:
                    out[place[text]] = None
                    times.pop(copy[0], None)
                    kept -= 1
                    continue
                first, best = copy
                newest = max(first, i)  # ids grow with time
                out[place[text]] = (newest, best)
                times[newest] = times.pop(first, 1) + 1
        return [kv for kv in out if kv is not None], times

    def told_first(self, query: str, ranked: list[tuple[int, float]]) -> list[tuple[int, float]]:
        """`ranked` with each message that asks (`asks`) and holds every word of the query
        placed just below the best message that tells them all too, where that one ranks
        lower: a question is short, so BM25 puts it ahead of the statement that answers it
        with the same words ("What was the kitchen budget?" over "The kitchen budget is
        48,250 euros"), but the statement is what a search for the words is after. Only for
        every word: a question that holds a word the statement lacks may be the better match
        (on the tuning set, ordering by the words each holds lost evidence; docs/memory.md)."""
        words = set(search_terms(query))
        bodies = self.bodies([i for i, _ in ranked])
        ids = [i for i, _ in ranked if i in bodies]
        if not words or not any(asks(bodies[i]) for i in ids):
            return ranked
        held = held_by([bodies[i] for i in ids], list(words))
        whole = {i for i, h in zip(ids, held, strict=True) if h >= words}
        told = [s for i, s in ranked if i in whole and not asks(bodies[i])]
        if not told:
            return ranked
        out = []
        for i, score in ranked:
            lower = [s for s in told if s <= score]
            if i in whole and asks(bodies[i]) and lower:
                score = math.nextafter(max(lower), -math.inf)
            out.append((i, score))
        return sorted(out, key=lambda kv: (-kv[1], kv[0]))

    def _lifted(
        self, cue: Cue | None, ranked: list[tuple[int, float]], limit: int
    ) -> list[tuple[int, float]]:
        """The first `limit` of `ranked` once the query's `Cue` has lifted the messages that
        can answer it, each by a share of the best score."""
        if cue is None or not ranked:
            return ranked[:limit]
        top = ranked[0][1]
        # Only a message within the largest lift of the `limit`-th score can end in the first
        # `limit`: the rest are left out before their text and dates are read.
        floor = ranked[min(limit, len(ranked)) - 1][1] - cue.most() * top
        ranked = [(i, s) for i, s in ranked if s >= floor]
        ids = [i for i, _ in ranked]
        lifted = dict.fromkeys(ids, 0.0)
        if cue.asks_when or cue.names:
            for i, text in self.bodies(ids).items():
                if cue.asks_when and _STATES_TIME.search(text):
                    lifted[i] += WHEN_WEIGHT
                if cue.names and cue.said_by(text):
                    lifted[i] += SPEAKER_WEIGHT
        if cue.months or cue.years:
            for i, _, created in records.message_dates(self.store, ids):
                if cue.dates(created, self.zone):
                    lifted[i] += DATE_WEIGHT
        scored = [(i, s + lifted[i] * top) for i, s in ranked]
        return sorted(scored, key=lambda kv: (-kv[1], kv[0]))[:limit]

    def _query_vector(self, query: str) -> Future[Any]:
        """The query's vector, being encoded on the worker; the last query's is kept, since
        auto-recall ranks the same text twice (this conversation, then the others)."""
        from heron.memory.vectors import encode_query

        last = self._last_query
        if last is not None and last[0] == query:
            return last[1]
        encoding = self._encoder().submit(encode_query, self.embedder, query)
        self._last_query = (query, encoding)
        return encoding

    def neighbours(self, ids: Sequence[int]) -> dict[int, set[int]]:
        """Each message's parent and children among `ids` and around them."""
        near: dict[int, set[int]] = {}
        for child, parent in records.parent_links(self.store, ids):
            if parent is not None:
                near.setdefault(child, set()).add(parent)
                near.setdefault(parent, set()).add(child)
        return near

    def sessions(self, ids: Iterable[int]) -> dict[int, tuple[int, int]]:
        """Message id -> (conversation, day): what counts as one sitting of a conversation."""
        from heron.memory.vectors import DAY  # lazy: vectors loads only when a search ranks

        rows = records.message_dates(self.store, list(ids))
        return {i: (conversation, int(created // DAY)) for i, conversation, created in rows}

    def search(
        self,
        query: str,
        limit: int = 10,
        *,
        conversation_id: int | None = None,
        exclude: Iterable[int] = (),
        standing: bool = False,
    ) -> Hits:
        """The best hits for `query`, a message that holds its words verbatim first.

        `standing`: only what the person still stands by, as recall gives it to the model
        (`recall_history`, `heron memory recall`): no message off its conversation's current
        branch, none stating what they had forgotten since (`turned_away`), and each of their
        own hits with what they said later taking it back (`corrections`). Otherwise every
        message said, a hit off the current branch marked `elsewhere` (a search of the
        record: `heron conversations search`, the browser's)."""
        skip = set(exclude)
        want = limit + len(skip)
        for _ in range(2):  # once more, longer, when what was left out leaves too few
            ranked, times = self.ranking(query, want, conversation_id)
            ranked = first_verbatim(ranked, self.verbatim(query, conversation_id, limit))
            ranked = [(i, s) for i, s in ranked if i not in skip]
            if not standing:
                break
            away = self.turned_away([i for i, _ in ranked])
            if not away or len(ranked) - len(away) >= limit or len(ranked) < want - len(skip):
                break
            want += len(away)
        if not standing:
            return Hits(self.marked(self._hits(ranked[:limit], query, times)))
        hits = self._hits([(i, s) for i, s in ranked if i not in away][:limit], query, times)
        # Said so, so that a search is not read as "never said" (qa22v L5): how many of the
        # matches were left out for stating what the person forgot since (a whole message
        # goes, though it says more).
        on = self.on_branch(sorted(away))
        forgotten = len(self.revoked([i for i in sorted(away) if i in on]))
        return Hits(self.corrections(hits, query), forgotten)

    def marked(self, hits: list[Hit]) -> list[Hit]:
        """`hits`, each off its conversation's current branch marked `elsewhere`."""
        on = self.on_branch([h.message_id for h in hits])
        return [dataclasses.replace(h, elsewhere=h.message_id not in on) for h in hits]

    def turned_away(self, ids: Sequence[int]) -> set[int]:
        """The messages among `ids` the person turned away from: off their conversation's
        current branch, or stating what they had forgotten since (`revoked`)."""
        if not ids:
            return set()
        off = set(ids) - self.on_branch(ids)
        return off | self.revoked([i for i in ids if i not in off])

    def on_branch(self, ids: Sequence[int]) -> set[int]:
        """Which of the messages asked for are on their conversation's current branch (not an
        answer `/retry` replaced, the old text of an `/edit`, a branch `/tree` left), found by
        walking each conversation's branch from its head down to the oldest of them. The
        answers are kept while the head stays (a branch to a given head never changes: rows
        are appended, never re-parented), so a message asked about again costs a look at its
        head: the hits from other conversations are often the same from turn to turn. A
        conversation's `created` tells a new one that took a deleted one's id apart."""
        placed = records.placed(self.store, ids)
        # held here: more conversations than are kept, or another thread's look, may drop
        # them from `_chains` meanwhile
        chains: dict[int, _Chain] = {}
        asked: dict[int, list[int]] = {}
        for i, (conversation, head, created) in placed.items():
            if head is None:
                continue
            chain = chains.get(conversation) or self._chain(conversation, head, created)
            chains[conversation] = chain
            if i not in chain.answers:
                asked.setdefault(conversation, []).append(i)
        for conversation, unknown in asked.items():
            chain = chains[conversation]
            on = records.on_chain(self.store, chain.head, unknown)
            chain.answers.update((i, i in on) for i in unknown)
        return {i for i, (c, _, _) in placed.items() if c in chains and chains[c].answers[i]}

    def _chain(self, conversation: int, head: int, created: float) -> _Chain:
        """The kept answers for the conversation's branch to `head` (made now if none)."""
        kept = self._chains.pop(conversation, None)
        if kept is None or (kept.head, kept.created) != (head, created):
            kept = _Chain(head, created)
        self._chains[conversation] = kept  # the newest at the end
        while len(self._chains) > CHAINS_KEPT:
            with contextlib.suppress(KeyError):  # another thread's look took it first
                self._chains.popitem(last=False)
        return kept

    def revoked(self, ids: Sequence[int]) -> set[int]:
        """The messages among `ids` that state what the person asked to forget after they
        were written (`heron memory forget`, manage_memory delete): a sentence of theirs
        overlaps a revoked statement as the memory guard reads it (heron/memory/guard.py
        `overlaps`: a run of six words, or most of the content words of the shorter). A
        sentence that asks to forget states nothing (`_stating`)."""
        revocations = records.revocations(self.store) if ids else []
        if not revocations:
            return set()
        written = {i: created for i, _, created in records.message_dates(self.store, ids)}
        out = set()
        for i, body in self.bodies(ids).items():
            later = [key for key, when in revocations if written.get(i, when) <= when]
            if later and any(overlaps(s, key) for s in _stating(body) for key in later):
                out.add(i)
        return out

    def corrections(
        self, hits: list[Hit], query: str, matched: Sequence[int] | None = None
    ) -> list[Hit]:
        """`hits`, each of the person's own with `later` set to what they said afterwards in
        the same conversation, on its current branch, that takes something back ("that is no
        longer true", "scratch that", "forget that": `takes_back`, in a sentence about the
        hit, not "Correction: I moved to Braga" under "I started learning Portuguese", qa24b
        L3): the next message they wrote, where a correction usually sits, else the newest of
        the search's other
        `matched` messages of theirs that does (by default the first CORRECTION_POOL matches
        of the query's words in each hit's conversation). A hit shown already is not
        repeated. A few queries for all the hits together (one walk of each branch)."""
        mine = [h for h in hits if h.typed and not h.elsewhere]
        if not mine:
            return hits
        scopes = {h.conversation_id for h in mine}
        if matched is None:  # a conversation's own search is cheap
            matched = [i for c in scopes for i, _ in self.bm25(query, CORRECTION_POOL, c)]
        shown = {h.message_id for h in hits}
        after = {
            h.message_id: records.typed_after(
                self.store, h.conversation_id, h.message_id, NEXT_LOOK
            )
            for h in mine
        }
        first = min(h.message_id for h in mine)
        asked = {*(i for ids in after.values() for i in ids), *(i for i in matched if i > first)}
        near = [i for i, c, _ in records.message_dates(self.store, sorted(asked)) if c in scopes]
        theirs = {
            r[0]: (r[1], r[5])
            for r in records.hit_rows(self.store, near)
            if r[3] == "user" and r[6] in (None, "user")
        }
        back = {i for i, (_, body) in theirs.items() if takes_back(body)}
        if not back:  # the common case: nothing they said takes anything back
            return hits
        # where the branch matters: what takes back, and what comes before it after a hit
        look = back | {i for ids in after.values() if back.intersection(ids) for i in ids}
        on = self.on_branch(sorted(look & set(theirs)))
        later: dict[int, int] = {}
        said = self.bodies([h.message_id for h in mine])
        for hit in mine:
            statement = said.get(hit.message_id, hit.snippet)
            following = [i for i in after[hit.message_id] if i in on][:1]
            newest = sorted(
                (
                    i
                    for i in set(matched) - shown
                    if i > hit.message_id and i in on and theirs[i][0] == hit.conversation_id
                ),
                reverse=True,
            )
            found = next(
                (
                    i
                    for i in [*following, *newest]
                    if i in back and takes_back(theirs[i][1], statement)  # about the hit
                ),
                None,
            )
            if found is not None:
                later[hit.message_id] = found
        if not later:
            return hits
        by_id = {h.message_id: h for h in self._hits([(i, 0.0) for i in later.values()], query)}
        return [dataclasses.replace(h, later=by_id.get(later.get(h.message_id, 0))) for h in hits]

    def verbatim(
        self, query: str, conversation_id: int | None = None, limit: int = 10
    ) -> list[int]:
        """Messages holding the query's words in its order (FTS5 phrase match, so case,
        punctuation and word endings aside), oldest first: a pointer's first words or a quote
        of a message. Only for queries of VERBATIM_WORDS words or more; fewer say too little
        to single a message out."""
        words = phrase_words(query)
        if len(words) < VERBATIM_WORDS:
            return []
        return records.phrase_matches(self.store, phrases(words), conversation_id, limit)

    def exact(self, query: str, limit: int = 10, conversation_id: int | None = None) -> list[Hit]:
        """The messages holding the query's words in its order, newest first: what a person
        searching for a phrase they remember means (`conversations search --exact`), where
        `search` ranks by meaning and lends scores to neighbours."""
        words = phrase_words(query)
        if not words:
            return []
        ids = records.phrase_matches(
            self.store, phrases(words), conversation_id, limit, newest=True
        )
        return self.marked(self._hits([(i, 0.0) for i in ids], query))

    def body(self, hit: Hit) -> str:
        """The indexed text of a hit's message, whole."""
        return records.indexed_text(self.store, [hit.message_id]).get(hit.message_id, "")

    def bodies(self, ids: Sequence[int]) -> dict[int, str]:
        """The indexed text of each message asked for that has any, whole; within a look,
        each message's is read once."""
        look = self._look()
        if look is None:
            return records.indexed_text(self.store, ids)
        known = look.bodies
        missing = [i for i in dict.fromkeys(ids) if i not in known]
        if missing:
            found = records.indexed_text(self.store, missing)
            known.update((i, found.get(i)) for i in missing)
        return {i: body for i in ids if (body := known[i]) is not None}

    def _hits(
        self, ranked: list[tuple[int, float]], query: str, times: dict[int, int] | None = None
    ) -> list[Hit]:
        if not ranked:
            return []
        by_id = {r[0]: r for r in records.hit_rows(self.store, [i for i, _ in ranked])}
        words = terms(query)
        copies = times or {}
        return [
            Hit(
                i,
                r[1],
                r[2],
                r[3],
                r[4],
                snippet(r[5], words),
                score,
                r[6],
                self.zone,
                times=copies.get(i, 1),
            )
            for i, score in ranked
            if (r := by_id.get(i)) is not None and self._said_by_the_person(i, r[5])
        ]

    def _said_by_the_person(self, message_id: int, body: str) -> bool:
        """False for a tool result the index took for an answer to ask_user (it holds results
        that begin as one does, whatever tool gave them: the index cannot look at the call):
        shown as "you", another tool's output would pass for the person's words."""
        if not body.startswith(ANSWERED):
            return True
        row = self.store.message(message_id)
        results = [p for p in row.message.parts if isinstance(p, ToolResult)]
        if not results or row.parent_id is None:
            return True  # a message the person typed that begins so
        calls = self.store.message(row.parent_id).message.parts
        asked = {c.id for c in calls if isinstance(c, ToolCall) and c.name == ASK_TOOL}
        return any(r.call_id in asked for r in results)


VERBATIM_WORDS = 3


def lists_the_day(named: NamedDays) -> bool:
    """Whether a query that names days asks only for what was said on them ("what did I say
    last Tuesday", "December 1"): it lists the person's messages of those days."""
    return not [w for w in terms(named.rest) if w not in ABOUT_WHAT_WAS_SAID]


@dataclass(frozen=True)
class DayListing:
    """The days a listing query names, and how many messages the person wrote on them."""

    days: tuple[date, ...]
    total: int

    def note(self, shown: int, limit: int, who: str, more: str) -> str | None:
        """What a listing of `shown` messages, of `limit` asked for, says when the days hold
        more of them: how many there are, and `more`, how to see the rest (a larger limit).
        None when all are shown, or the listing was not cut by its limit (the rest are
        messages the model reads already, or that the person turned away from)."""
        if shown < limit or shown >= self.total:
            return None
        named = ", ".join(f"{d:%a %Y-%m-%d}" for d in self.days)
        return (
            f"The first {shown} of the {self.total} messages {who} wrote on {named}, oldest "
            f"first: {more}, or add words to search within that day."
        )


# Words that ask for what was said rather than name what it was about: "what did I say last
# Tuesday" asks for that day's messages, whatever they were about (`Recall.day_ranking`).
ABOUT_WHAT_WAS_SAID = frozenset(
    [
        "say",
        "said",
        "says",
        "tell",
        "told",
        "write",
        "wrote",
        "written",
        "talk",
        "talked",
        "mention",
        "mentioned",
        "ask",
        "asked",
        "discuss",
        "discussed",
        "chat",
        "chatted",
        "message",
        "messages",
        "happen",
        "happened",
        "type",
        "typed",
    ]
)
# Messages whose text `Recall.distinct` reads at once, at least.
DISTINCT_READ = 10
# Messages read to find how a respelled word is written (`Recall._written`).
WRITTEN_LOOK = 5
# Messages of the person after a hit read to find the next one on the current branch (those of
# a branch /retry or /edit left come between).
NEXT_LOOK = 4
# Matches of a query in a hit's conversation among which a later correction is looked for.
CORRECTION_POOL = 50

# Where a message's sentences end (its line breaks too): what `Recall.revoked` compares.
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text) if s.strip()]


def _stating(text: str) -> Iterator[str]:
    """The sentences of `text` that may state something: not a request to forget, which quotes
    what it asks to forget without saying it holds ("Please forget that I take my coffee
    black. These days I take it with oat milk." hid the new statement with it, qa24b M1)."""
    return (s for s in _sentences(text) if not asks_to_forget(s))


def first_verbatim(ranked: list[tuple[int, float]], verbatim: list[int]) -> list[tuple[int, float]]:
    """`ranked` with the verbatim matches moved to the front, in their ranked order (those the
    ranking missed after them, oldest first), each scored at least as the best hit."""
    if not verbatim:
        return ranked
    scores = dict(ranked)
    top = ranked[0][1] if ranked else 0.0
    chosen = set(verbatim)
    front = [(i, s) for i, s in ranked if i in chosen]
    front += [(i, top) for i in verbatim if i not in scores]
    front = [(i, max(s, top)) for i, s in front]
    return front + [(i, s) for i, s in ranked if i not in chosen]


def lend(scores: dict[int, float], near: dict[int, set[int]]) -> list[tuple[int, float]]:
    """Each message keeps its score and gets NEIGHBOUR_SHARE of its neighbours' scores."""
    return sorted(_lent(scores, near).items(), key=lambda kv: (-kv[1], kv[0]))


def _lent(scores: dict[int, float], near: dict[int, set[int]]) -> dict[int, float]:
    """`scores`, each message given NEIGHBOUR_SHARE of the score of the message before it and
    of the best of those after it (`near` is symmetric: a message's parent and children). On
    any branch a message reads between one message and the next; the children of a message
    are its branches (a retry, an edit), each the next message of another reading, so two
    branches that say the same thing do not lend it twice (QA22t: "branch second" sent on
    two branches put the answer before them, holding only "branch", above both)."""
    out = dict(scores)
    for item, others in near.items():
        # ids grow with time: a message's parent is older than it, its children newer
        before = after = None
        for other in others:  # one pass, no generator: a ranking lends over some 300 messages
            score = scores.get(other)
            if score is None:
                continue
            if other < item:
                before = score if before is None else max(before, score)
            elif other > item:
                after = score if after is None else max(after, score)
        for lender in (before, after):
            if lender is not None:
                out[item] = out.get(item, 0.0) + NEIGHBOUR_SHARE * lender
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
    hits = [p for w in words if (p := _position(lower, w)) >= 0]
    start = max(0, min(hits) - width // 3) if hits else 0
    piece = text[start : start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(text) else "")


def _position(lower: str, word: str) -> int:
    """Where a query term first occurs in a lowercased text, -1 if not: a code by its
    pattern, since its parts may be separated by any punctuation ("qx 99812" in "qx-99812")."""
    if _literal(word):
        return lower.find(word)
    found = _held_pattern(word).search(lower)
    return found.start() if found else -1


def held_terms(body: str, words: Sequence[str]) -> set[str]:
    """Which of `words` occur in `body` as a word (a long word also as a word's start, as the
    query matches it; a code's parts one after the other, whatever separates them: "v2 3 1"
    in "v2.3.1"). The plain substring test first (a code's: its first part): a pattern that
    opens with a lookbehind is tried at every position of the body, and most candidates hold
    few of a long query's words. `held_by` gives the same for many bodies at once, faster."""
    lower = body.lower()
    return {w for w in words if _first_word(w) in lower and _held_pattern(w).search(lower)}


def _first_word(term: str) -> str:
    """What every text that holds the term holds first: its first word up to a code's seam
    ("qx" of "qx99812", which "qx-99812" holds too), or the first group of a number it opens
    with ("48" of "48250", which "48,250" holds too)."""
    whole = numbers.digits(term.split(" ")[0])
    if whole is not None:
        return numbers.lead(whole)
    return codes.head(term)


def _literal(term: str) -> bool:
    """Whether a term is found as it is written: one word, no number of several groupings, no
    code of several spellings."""
    return _plain(term) and not numbers.has_number(term) and not codes.has_seam(term)


@functools.lru_cache(maxsize=1024)
def _held_pattern(word: str) -> re.Pattern[str]:
    # A word starts where no letter or digit precedes it (`_WORD`'s characters); a short word,
    # a number or a code must also end there, a long word may go on (the query matches it as
    # a prefix). A code's parts are separated by anything but letters and digits, as the
    # index's tokenizer separates them, and its seams by that or nothing; a number of 1,000
    # or more is found in any grouping (`codes.pattern`).
    start = r"(?<![^\W_])" + codes.pattern(word)
    return re.compile(start if _prefixed(word) else start + r"(?![^\W_])")


def held_by(bodies: Sequence[str], words: Sequence[str]) -> list[set[str]]:
    """`held_terms` of each body, for many bodies at once (`words` are query terms: letters
    and digits, a code's parts joined by a space). Each word is looked for once in all the
    bodies joined by line breaks (no word spans two bodies), each occurrence checked at its
    edges as the pattern checks them (a letter or digit of `_WORD` is a character whose
    `isalnum()` is true), and a body that holds the word is skipped past: one search per
    word, not one per body and word. A code is found by its pattern, a match across two
    bodies skipped."""
    lowered = [b.lower() for b in bodies]
    starts: list[int] = []
    at = 0
    for text in lowered:
        starts.append(at)
        at += len(text) + 1
    joined = "\n".join(lowered)
    out: list[set[str]] = [set() for _ in bodies]
    for word in words:
        if not _literal(word):
            _held_code(joined, starts, word, out)
            continue
        whole, size = not _prefixed(word), len(word)
        pos = joined.find(word)
        while pos >= 0:
            end = pos + size
            if (pos == 0 or not joined[pos - 1].isalnum()) and (
                not whole or end == len(joined) or not joined[end].isalnum()
            ):
                n = bisect.bisect_right(starts, pos) - 1
                out[n].add(word)
                pos = joined.find(word, starts[n + 1]) if n + 1 < len(starts) else -1
            else:
                pos = joined.find(word, pos + 1)
    return out


def _held_code(joined: str, starts: list[int], word: str, out: list[set[str]]) -> None:
    """`held_by` for a code ("qx-99812") or a number with its word: each body whose text
    matches its pattern holds it. The pattern is tried only where its first part occurs (a
    plain search), as `held_by` finds a word."""
    pattern, first = _held_pattern(word), _first_word(word)
    pos = joined.find(first)
    while pos >= 0:
        found = pattern.match(joined, pos)
        n = bisect.bisect_right(starts, pos) - 1
        ends = starts[n + 1] - 1 if n + 1 < len(starts) else len(joined)
        if found is not None and found.end() <= ends:
            out[n].add(word)
            pos = joined.find(first, ends) if n + 1 < len(starts) else -1
        else:  # not here, or it ran into the next body: look again from the next character
            pos = joined.find(first, pos + 1)
