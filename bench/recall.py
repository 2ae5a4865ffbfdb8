"""Recall over history on LoCoMo: recall@5/10/20 of the evidence turns, and query latency.

    .venv/bin/python bench/recall.py --locomo ../shared/eval/locomo-dev.json [--json]

Each LoCoMo conversation is stored as a Heron conversation (one message per turn, "speaker:
text", dated by its session), each question of categories 1-4 is asked through heron's recall
restricted to its conversation, and recall@k is the share of a question's evidence turns among
the first k hits, averaged over questions. BM25 alone, then fused with embeddings when the
`heron[embeddings]` extra is installed (null otherwise). Latency: p50/p95 of a search over
100,000 stored messages (BM25, the path every search takes).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heron.memory.recall import Recall
from heron.messages import Message, Text, parts_to_json
from heron.store import Store

KS = (5, 10, 20)
CATEGORIES = (1, 2, 3, 4)


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
            ids[stored.id] = turn["dia_id"]
        n += 1
    return conv.id, ids


def evaluate(recall: Recall, samples: list[dict[str, Any]], store: Store, fused: bool) -> dict:
    per_cat: dict[int, dict[int, list[float]]] = {c: {k: [] for k in KS} for c in CATEGORIES}
    for sample, (cid, ids) in samples:
        for qa in sample["qa"]:
            if qa.get("category") not in CATEGORIES or not qa.get("evidence"):
                continue
            evidence = set(qa["evidence"])
            if fused:
                ranked = recall.ranked(qa["question"], max(KS), cid)
            else:
                ranked = recall.lexical(qa["question"], max(KS), cid)
            got = [ids.get(i) for i, _ in ranked]
            for k in KS:
                per_cat[qa["category"]][k].append(len(evidence & set(got[:k])) / len(evidence))
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


def latency(raw: list[dict[str, Any]], total: int = 100_000, queries: int = 300) -> dict:
    """p50/p95 of Recall.search over `total` messages synthesised from the LoCoMo turns."""
    rng = random.Random(7)
    turns = [
        _turn_text(t)
        for s in raw
        for key, v in s["conversation"].items()
        if key.startswith("session_") and isinstance(v, list)
        for t in v
    ]
    words = " ".join(turns).split()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "latency.db")
        conv_ids = [store.open_conversation(f"synthetic-{i}").id for i in range(200)]
        rows = []
        for i in range(total):
            if i % 3:
                text = rng.choice(turns)
            else:
                text = " ".join(rng.choices(words, k=rng.randint(8, 40)))
            parts = parts_to_json([Text(text)])
            rows.append((conv_ids[i % len(conv_ids)], "user" if i % 2 else "assistant", parts, i))
        with store.transaction() as c:
            c.executemany(
                "INSERT INTO messages (conversation_id, role, parts, created) VALUES (?, ?, ?, ?)",
                rows,
            )
        recall = Recall(store)
        questions = [qa["question"] for s in raw for qa in s["qa"]]
        timings = []
        for q in (rng.choice(questions) for _ in range(queries)):
            start = time.perf_counter()
            recall.search(q, 10)
            timings.append((time.perf_counter() - start) * 1000)
        store.close()
    timings.sort()
    return {
        "p50": round(statistics.median(timings), 2),
        "p95": round(timings[int(len(timings) * 0.95) - 1], 2),
        "messages": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locomo", required=True, type=Path, help="A LoCoMo-format JSON file.")
    parser.add_argument("--json", action="store_true", help="Print one JSON line.")
    parser.add_argument("--messages", type=int, default=100_000, help="Messages for latency.")
    args = parser.parse_args()
    raw = json.loads(args.locomo.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "recall.db")
        samples = [(s, load(store, s)) for s in raw]
        bm25 = evaluate(Recall(store), samples, store, fused=False)
        fused = None
        from heron.memory.vectors import default_embedder

        embedder = default_embedder()
        if embedder is not None:
            recall = Recall(store, embedder)
            recall.index_missing()
            fused = evaluate(recall, samples, store, fused=True)
        store.close()
    lat = latency(raw, args.messages)
    result = {"bm25": bm25, "fused": fused, "latency_ms": lat}
    if args.json:
        print(json.dumps(result))
        return
    for name, figures in (("BM25", bm25), ("fused", fused)):
        if figures is None:
            print(f"{name:6} not available (install heron[embeddings])")
            continue
        print(
            f"{name:6} " + "  ".join(f"{k} {figures[k]:.3f}" for k in (f"recall@{k}" for k in KS))
        )
        for cat, cat_figures in figures["per_category"].items():
            print(f"  category {cat}: " + "  ".join(f"{k} {v:.3f}" for k, v in cat_figures.items()))
    print(f"latency over {lat['messages']:,} messages: p50 {lat['p50']} ms, p95 {lat['p95']} ms")


if __name__ == "__main__":
    main()
