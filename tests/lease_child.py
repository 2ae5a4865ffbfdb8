"""A process that hammers the turn lease of a few conversations (tests/test_lease_processes.py).

`python tests/lease_child.py DB NAME CLAIMS KEYS` says "ready", waits for a line, then claims
the lease of one of the conversations `k0`..`k{KEYS-1}` in turn, holds it a moment, checks it
is still its own the way SAVE does (`settle_turn`), releases it, and prints one JSON line: the
intervals it held a lease (conversation id, start, end), how many claims found it busy, and how
many checks found the lease gone.
`python tests/lease_child.py DB hold TTL` claims `k0` as a process of another host would (so only
the expiry frees it) for TTL seconds, prints "held", and sleeps until it is killed.
"""

from __future__ import annotations

import json
import sys
import time

from heron.store import Store
from heron.store import engine_state as es


def main(db: str, name: str, claims: int, keys: int) -> None:
    store = Store(db)
    ids = [store.open_conversation(f"k{i}").id for i in range(keys)]
    held: list[tuple[int, float, float]] = []
    busy = lost = 0
    print("ready", flush=True)
    sys.stdin.readline()  # "go": both processes start claiming together
    for n in range(claims):
        cid = ids[n % keys]
        owner = f"{name}:{n}"
        claim = es.try_lease(store, cid, owner, ttl=30.0)
        if claim.holder is not None:
            busy += 1
            time.sleep(0.001)  # as a waiting turn polls (heron/agent/leases.py, shorter)
            continue
        start = time.time()
        time.sleep(0.001)  # a turn, very short: the other process claims meanwhile
        end = time.time()  # before the release: a claim after it is no overlap
        ok = es.settle_turn(store, cid, claim.epoch, owner, clear_checkpoint=False)
        lost += not ok
        if not ok:
            es.release_lease(store, cid, owner)
        held.append((cid, start, end))
        time.sleep(0.001)  # between turns: the other process's claim can come in
    print(json.dumps({"held": held, "busy": busy, "lost": lost}), flush=True)


def hold(db: str, ttl: float) -> None:
    es.HOST = "another-host"  # its pid means nothing here: the lease lives until it expires
    store = Store(db)
    claim = es.try_lease(store, store.open_conversation("k0").id, "holder", ttl=ttl)
    assert claim.holder is None
    print("held", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    if sys.argv[2] == "hold":
        hold(sys.argv[1], float(sys.argv[3]))
    else:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
