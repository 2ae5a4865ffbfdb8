"""The recall bench's evidence ids and k-fold sets (bench/recall.py): LoCoMo's own data holds
malformed ids that would otherwise match no turn."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "recall.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_recall", _PATH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_recall"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["D1:3"], {"D1:3"}),
        (["D30:05"], {"D30:5"}),
        (["D:11:26"], {"D11:26"}),
        (["D8:6; D9:17"], {"D8:6", "D9:17"}),
        (["D8:6 D9:17"], {"D8:6", "D9:17"}),
        (["D2::4:"], {"D2:4"}),
        ("D4:1;D4:2", {"D4:1", "D4:2"}),
        (["d3 : 07", "D3:7"], {"D3:7"}),
        ([], set()),
        (["no id here"], set()),
    ],
)
def test_evidence_ids_normalise_malformed_ids(raw, expected) -> None:
    assert bench.evidence_ids(raw) == expected


def test_a_normalised_turn_id_matches_a_malformed_evidence_id() -> None:
    turn = min(bench.evidence_ids("D30:5"))
    assert turn in bench.evidence_ids(["D30:05"])


def _question(conversation: int, session: int) -> object:
    return bench.Question(conversation, conversation + 1, "q", frozenset({"D1:1"}), 4, session)


def test_folds_split_questions_by_conversation_and_by_session() -> None:
    asked = [_question(c, s) for c in (0, 1) for s in range(1, 8)]
    folds = bench.fold_sets(asked, 2)
    by_conv = folds["conversation"]
    assert [sorted({asked[n].conversation for n in f}) for f in by_conv] == [[0], [1]]
    by_session = folds["session"]
    every = sorted(n for f in by_session for n in f)
    assert every == list(range(len(asked)))  # each question held out exactly once
    for fold in by_session:
        residues = {asked[n].session % bench.SESSION_FOLDS for n in fold}
        assert len(residues) == 1  # a held-out fold shares no session with the rest


def test_summary_scores_the_share_of_evidence_in_the_first_k() -> None:
    asked = [bench.Question(0, 1, "q", frozenset({"D1:1", "D1:2"}), 1, 1)]
    got = [["D1:1"] + [None] * 9 + ["D1:2"]]
    figures = bench.summary(asked, got)
    assert figures["recall@10"] == 0.5
    assert figures["recall@25"] == 1.0
    assert figures["per_category"]["1"]["recall@5"] == 0.5


def test_auto_recall_rates_pool_counts_of_several_stores() -> None:
    one = {"questions": 10, "fired": 4, "brought": 2, "hits": 12, "good": 3}
    two = {"questions": 30, "fired": 6, "brought": 3, "hits": 4, "good": 3}
    figures = bench.rates([one, two])
    assert figures["fire"] == 0.25
    assert figures["evidence"] == 0.125
    assert figures["precision"] == 0.375  # 6 of 16 hits, not the mean of 0.25 and 0.75
    assert bench.rates([])["precision"] == 0.0


def _sample(name: str, a: str, b: str, topic: str) -> dict:
    """A LoCoMo-shaped conversation of two sessions and its questions."""
    turns = [
        [(a, f"I started a {topic} class last week"), (b, "how is it going"),
         (a, f"the {topic} teacher is great and patient"), (b, "nice to hear")],
        [(b, "we went camping at the beach"), (a, "sounds fun, did you see the stars"),
         (b, "yes, a meteor shower over the beach")],
    ]  # fmt: skip
    conversation: dict = {"speaker_a": a, "speaker_b": b}
    for s, session in enumerate(turns, 1):
        conversation[f"session_{s}_date_time"] = f"1:00 pm on {s} May, 2023"
        conversation[f"session_{s}"] = [
            {"speaker": who, "text": text, "dia_id": f"D{s}:{t}"}
            for t, (who, text) in enumerate(session, 1)
        ]
    qa = [
        {"question": f"What class did {a} start?", "evidence": ["D1:1"], "category": 4},
        {"question": f"What does {a} say about the {topic} teacher?", "evidence": ["D1:3"],
         "category": 4},
        {"question": f"Where did {b} go camping?", "evidence": ["D2:1"], "category": 4},
    ]  # fmt: skip
    return {"sample_id": name, "conversation": conversation, "qa": qa}


def test_the_gates_k_fold_check_runs_the_gate_as_shipped(tmp_path, monkeypatch) -> None:
    """`cross_validate_auto` memoises auto-recall's searches (`_Memo`): under it the shipped
    gate injects what it injects without it, and every setting of a (small) grid runs."""
    from heron.memory.recall import Recall
    from heron.store import Store

    store = Store(tmp_path / "folds.db")
    raw = [_sample("one", "Ann", "Bo", "pottery"), _sample("two", "Cy", "Di", "painting")]
    samples = [(s, bench.load(store, s)) for s in raw]
    recall = Recall(store)
    plain = bench.auto_outcomes(recall, samples)
    with bench._Memo(recall):
        assert bench.auto_outcomes(recall, samples) == plain
    assert sum(c["brought"] for c in plain) > 0  # the comparison says something
    monkeypatch.setattr(bench, "AUTO_GRID", {**bench.AUTO_GRID, "own": (0.3, 0.6)})
    figures = bench.cross_validate_auto(recall, samples)
    assert figures["tuning"] == bench.rates(plain)
    assert len(figures["conversation"]["folds"]) == 2
    store.close()
