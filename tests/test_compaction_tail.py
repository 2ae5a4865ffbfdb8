"""A consolidated branch is read from its fold on (`load_branch`, `Store.branch_since`): what
the model sees, and the plan of every row read, must be exactly what the whole branch gives."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strength import examples_on

from heron.context.history import load_branch
from heron.context.view import ViewOptions, derive_view
from heron.messages import Message, Text, ToolCall, ToolResult, Usage, assistant, user
from heron.store import Store
from heron.store import compactions as folds


def _message(rng: random.Random, i: int, last: Message | None) -> Message:
    if last is not None and last.role == "assistant" and last.tool_calls:
        call = last.tool_calls[0]
        return Message("user", [ToolResult(call.id, f"result {i} " + "x" * rng.randint(0, 300))])
    if last is None or last.role == "assistant":
        return user(f"question {i}")
    if rng.random() < 0.4:
        return Message("assistant", [ToolCall(f"c{i}", "read_file", {"path": f"f{i}"})])
    return assistant(f"answer {i}")


def _build(store: Store, seed: int, steps: int) -> int:
    """A random conversation: appends, head moves (branches), /new separators, consolidations
    of the current branch or an old one, and in-flight folds with their marks."""
    rng = random.Random(seed)
    conv = store.open_conversation("k")
    branch: list[int] = []
    last: Message | None = None
    for i in range(steps):
        roll = rng.random()
        if roll < 0.05 and len(branch) > 2:  # edit or retry: the head goes back
            branch = branch[: rng.randrange(1, len(branch))]
            store.set_head(conv.id, branch[-1])
            last = store.message(branch[-1]).message
        elif roll < 0.08:
            sep = Message("assistant", [Text("---")])
            branch.append(store.append(conv.id, sep, kind="separator").id)
            last = None
        elif roll < 0.14 and len(branch) > 3:
            cut = rng.randrange(1, len(branch) - 1)
            folds.add_compaction(
                store,
                conv.id,
                kind=rng.choice(["consolidation", "fallback"]),
                reason="test",
                summary=f"summary {i}",
                first_row_id=branch[0],
                last_row_id=branch[cut],
            )
        elif roll < 0.18 and len(branch) > 4:
            start = rng.randrange(1, len(branch) - 2)
            folded = branch[start : start + rng.randint(1, 2)]
            folds.add_compaction(
                store,
                conv.id,
                kind="inflight",
                reason="test",
                summary=f"checkpoint {i}",
                first_row_id=folded[0],
                last_row_id=folded[-1],
                anchor_row_id=branch[start - 1],
                compacted_rows=folded,
            )
        else:
            last = _message(rng, i, last)
            branch.append(store.append(conv.id, last).id)
    return conv.id


def _assert_same(tail_store: Store, path: str | Path, conversation_id: int) -> None:
    whole_store = Store(path)
    try:
        whole = load_branch(whole_store, conversation_id, full=True)
    finally:
        whole_store.close()
    part = load_branch(tail_store, conversation_id)
    ids = [r.id for r in whole.rows]
    assert [r.id for r in part.rows] == ids[len(ids) - len(part.rows) :]  # a suffix
    assert part.consolidation == whole.consolidation
    assert part.plan.folded_upto == whole.plan.folded_upto
    assert part.plan.compacted == whole.plan.compacted
    read = {r.id for r in part.rows}
    assert part.plan.checkpoints == {k: v for k, v in whole.plan.checkpoints.items() if k in read}
    assert derive_view(part.rows, part.plan, ViewOptions()) == derive_view(
        whole.rows, whole.plan, ViewOptions()
    )


def test_the_tail_of_a_branch_plans_and_views_like_the_whole(
    new_db: Callable[[str], str | Path], request: pytest.FixtureRequest
) -> None:
    @settings(max_examples=examples_on(request, 40, pg=12), deadline=None)
    @given(seed=st.integers(0, 10_000), steps=st.integers(5, 80))
    def check(seed: int, steps: int) -> None:
        path = new_db(f"tail-{seed}-{steps}")  # a fresh database per example, either backend
        store = Store(path)
        conversation_id = _build(store, seed, steps)
        _assert_same(store, path, conversation_id)
        _assert_same(store, path, conversation_id)  # again, from the kept branch
        store.append(conversation_id, user("one more"))  # extends what is kept
        _assert_same(store, path, conversation_id)

    check()


def _long(store: Store, n: int) -> tuple[int, list[int]]:
    conv = store.open_conversation("k")
    ids = []
    for i in range(n):
        ids.append(store.append(conv.id, user(f"q{i}") if i % 2 == 0 else assistant("a")).id)
    return conv.id, ids


def test_a_consolidated_branch_reads_only_from_the_fold(db: str | Path) -> None:
    store = Store(db)
    cid, ids = _long(store, 200)
    folds.add_compaction(
        store, cid, kind="consolidation", reason="t", summary="s", last_row_id=ids[189]
    )
    state = load_branch(store, cid)
    assert [r.id for r in state.rows] == ids[189:]
    assert state.plan.folded_upto == ids[189]
    assert len(load_branch(store, cid, full=True).rows) == 200


def test_a_fold_on_another_branch_reads_the_whole_branch(db: str | Path) -> None:
    store = Store(db)
    cid, ids = _long(store, 20)
    folds.add_compaction(
        store, cid, kind="consolidation", reason="t", summary="s", last_row_id=ids[15]
    )
    store.set_head(cid, ids[9])  # back before the fold: a retry from row 9
    other = store.append(cid, assistant("other"))
    state = load_branch(store, cid)
    assert state.consolidation is None
    assert [r.id for r in state.rows] == [*ids[:10], other.id]


def test_an_older_in_flight_fold_keeps_its_rows_in_the_plan(db: str | Path) -> None:
    store = Store(db)
    cid, ids = _long(store, 40)
    folds.add_compaction(
        store,
        cid,
        kind="inflight",
        reason="t",
        summary="c",
        anchor_row_id=ids[4],
        compacted_rows=[ids[5], ids[6]],
    )
    folds.add_compaction(
        store, cid, kind="consolidation", reason="t", summary="s", last_row_id=ids[30]
    )
    state = load_branch(store, cid)
    assert state.rows[0].id == ids[5]  # a checkpoint quotes the rows folded in flight
    assert state.plan.compacted == {ids[5], ids[6]}


def test_the_running_turn_is_read_even_when_a_fold_passed_it(db: str | Path) -> None:
    store = Store(db)
    cid, _ = _long(store, 10)
    turn_id, asked = store.begin_turn(cid, "run-1", user("do the work"))
    steps = [store.append(cid, assistant(f"step {i}")).id for i in range(10)]
    folds.add_compaction(  # an overflow in the turn folded past its request
        store, cid, kind="consolidation", reason="overflow", summary="s", last_row_id=steps[4]
    )
    assert load_branch(store, cid).rows[0].id == asked.id
    store.finish_turn(
        turn_id, status="done", stop_reason="done", usage=Usage(), model_calls=1, tool_calls=0
    )
    assert load_branch(store, cid).rows[0].id == steps[4]


def test_branch_since_matches_a_fresh_read(db: str | Path) -> None:
    store = Store(db)
    cid, ids = _long(store, 30)
    assert [r.id for r in store.branch_since(cid, ids[25])] == ids[25:]
    store.append(cid, user("new"))  # the kept tail is extended
    fresh = Store(db)
    assert [r.id for r in store.branch_since(cid, ids[20])] == [r.id for r in fresh.branch(cid)][
        20:
    ]
    assert [r.id for r in store.branch(cid)] == [r.id for r in fresh.branch(cid)]
    store.set_head(cid, ids[10])
    assert [r.id for r in store.branch_since(cid, ids[20])] == [ids[10]]  # below the floor
    assert [r.id for r in store.branch_since(cid, 0)] == ids[:11]
    fresh.close()
