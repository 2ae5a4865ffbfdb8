"""The size-normalised auto-recall gate (`gated_hits`): what fires for a question must not
change when the history around it grows with unrelated text."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heron.memory.auto import gated_hits
from heron.memory.recall import Recall
from heron.messages import Message, Text
from heron.store import Store

LINES = [
    "Caroline: I went to the LGBTQ support group yesterday and it was powerful",
    "Melanie: my kids loved the pottery class we took last weekend",
    "Caroline: I am researching adoption agencies for next year",
    "Melanie: we camped at the beach and watched the meteor shower",
    "Caroline: the support group helped me feel accepted",
]
UNRELATED = ["zebra", "quartz", "violin", "glacier", "tulip", "harbor", "nickel", "orbit"]


def _store(where: str | Path, copies: int) -> tuple[Store, int]:
    store = Store(where)
    conv = store.open_conversation("locomo")
    for line in LINES:
        store.append(conv.id, Message("user", [Text(line)]))
    other = store.open_conversation("elsewhere")
    for n in range(copies * len(LINES)):
        words = " ".join(UNRELATED[(n + k) % len(UNRELATED)] for k in range(6))
        store.append(other.id, Message("user", [Text(words)]))
    return store, conv.id


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(copies=st.integers(min_value=1, max_value=40), line=st.sampled_from(LINES))
def test_more_unrelated_history_does_not_change_what_fires(tmp_path, new_db, copies, line) -> None:
    question = "what did " + line.split(": ", 1)[1]
    small, cid = _store(new_db(f"gate-{copies}-small"), 0)
    big, big_cid = _store(new_db(f"gate-{copies}"), copies)
    try:
        before = gated_hits(Recall(small), question, cid)
        after = gated_hits(Recall(big), question, big_cid)
        assert before  # the question's own line always fires
        # the same hits, with the same normalised scores: the gate cannot drift with size
        assert after == before
    finally:
        small.close()
        big.close()
        for p in tmp_path.glob("gate-*"):
            p.unlink()


def test_the_gate_fires_on_the_evidence_and_not_on_a_stranger(db) -> None:
    store, cid = _store(db, 3)
    try:
        recall = Recall(store)
        fired = gated_hits(recall, "what support group is Caroline in?", cid)
        assert fired
        assert "support group" in recall.body(recall._hits(fired, "x")[0])
        assert gated_hits(recall, "zebra quartz violin", cid) == []
        seen = [i for i, _ in fired]
        assert not {i for i, _ in gated_hits(recall, "what support group?", cid, seen)} & set(seen)
    finally:
        store.close()
