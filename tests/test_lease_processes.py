"""The turn lease across real OS processes, on both backends (fixture `db`): two processes
claiming the same conversations as fast as they can never both hold one, and a lease whose
holder was killed on another host is taken over once it expires, not before.

On SQLite the claim is serialized by `BEGIN IMMEDIATE`; on PostgreSQL by the conversation's row
lock (heron/store/engine_state.py `try_lease`). Without that lock these tests fail there."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import reap, spawn, start_together  # noqa: F401  (reap: an autouse fixture)

from heron.store import Store
from heron.store import engine_state as es

pytestmark = pytest.mark.slow  # OS processes

CHILD = str(Path(__file__).with_name("lease_child.py"))


def _spawn(*args: object) -> subprocess.Popen[str]:
    return spawn([sys.executable, CHILD, *map(str, args)])


@pytest.mark.parametrize("keys", [1, 4])
def test_two_processes_never_hold_one_conversation_at_once(db, keys):
    store = Store(db)  # migrated and the conversations made before the race
    ids = {store.open_conversation(f"k{i}").id for i in range(keys)}
    procs = [_spawn(db, name, 300, keys) for name in ("A", "B")]
    outs = start_together(procs, timeout=120)
    reports = [json.loads(out.splitlines()[-1]) for out, _ in outs]
    assert [r["lost"] for r in reports] == [0, 0]  # no SAVE found its lease taken
    assert all(r["held"] for r in reports)
    assert sum(r["busy"] for r in reports) > 0  # they did contend
    spans = sorted(tuple(h) for r in reports for h in r["held"])
    assert {s[0] for s in spans} == ids
    for cid, group in itertools.groupby(spans, key=lambda s: s[0]):
        held = [(start, end) for _, start, end in group]
        overlaps = [(a, b) for a, b in itertools.pairwise(held) if b[0] < a[1]]
        assert not overlaps, f"conversation {cid} held twice at once: {overlaps[:3]}"
    assert store.query("SELECT COUNT(*) FROM turn_leases")[0][0] == 0


def test_a_killed_holders_lease_is_taken_over_after_it_expires(db):
    store = Store(db)
    cid = store.open_conversation("k0").id
    holder = _spawn(db, "hold", 5.0)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    refused = es.try_lease(store, cid, "taker", ttl=30.0)
    assert refused.holder is not None and refused.holder.host == "another-host"
    while es.try_lease(store, cid, "taker", ttl=30.0).holder is not None:
        time.sleep(0.1)
    assert time.time() >= refused.holder.expires  # taken once expired, not before
    assert es.lease_holder(store, cid) is not None
    assert es.lease_holder(store, cid).owner == "taker"  # type: ignore[union-attr]
