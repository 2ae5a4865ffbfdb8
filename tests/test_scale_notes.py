"""Notes between the face and the workers (heron/scale/notes.py) over a real PostgreSQL's
LISTEN/NOTIFY: in the order posted, each once, a burst in few NOTIFYs, a long note whole."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heron.scale.cluster import cluster_of
from heron.scale.notes import PIECE, Listener, Publisher, packed, start_listener, stop_task


class Counting(Listener):
    """A listener that also counts the payloads (NOTIFYs and pieces) it received."""

    payloads = 0

    def _join(self, payload: str) -> list[dict[str, Any]]:
        self.payloads += 1
        return super()._join(payload)


@pytest.mark.pg
async def test_a_burst_arrives_in_order_once_in_few_notifies(pg_url: str) -> None:
    cluster = cluster_of(pg_url)
    heard: list[dict[str, Any]] = []
    listener = Counting(cluster, heard.append)
    task = await start_listener(listener)
    publisher = Publisher(cluster)
    try:
        long_text = "x" * (3 * PIECE)  # more than one NOTIFY can hold: sent in pieces
        sent = [
            {"t": "event", "n": i, "text": long_text if i == 100 else "delta"} for i in range(300)
        ]
        posted = [publisher.post(note) for note in sent[:-1]]  # as a turn streams: not awaited
        await publisher.send(sent[-1])  # sent after every note posted before it
        assert all(p.done() for p in posted)
        async with asyncio.timeout(60):
            while len(heard) < len(sent):
                await asyncio.sleep(0.01)
    finally:
        await publisher.close()
        await stop_task(task)
    assert heard == sent
    assert listener.payloads < len(sent) / 5  # batched: without it, one NOTIFY per note


@given(st.lists(st.text(max_size=3 * PIECE // 2).map(lambda t: json.dumps({"t": t}))))
def test_packing_keeps_every_note_in_order_within_the_size(payloads: list[str]) -> None:
    unpacked: list[str] = []
    for payload in packed(payloads):
        found = json.loads(payload)
        if isinstance(found, list):  # several notes: within one NOTIFY's size
            assert len(payload) <= PIECE
            unpacked += [json.dumps(note) for note in found]
        else:  # one note alone (a long one, sent in pieces)
            unpacked.append(payload)
    assert unpacked == payloads
