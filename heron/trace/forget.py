"""A forgotten secret taken out of the recorded requests that carried it.

A forget of a memory entry holding a secret (heron/memory/service.py) takes it out of memory,
out of the memory folder's history and out of the requests a conversation replays. The trace
keeps every request as it was sent, so it holds the secret too: here each blob (a message, a
piece of a system prompt) and each request stored whole that holds it is rewritten, the
secret's words replaced by a marker. A blob keeps the sha256 it was stored under. A replay or
an export of those runs then shows the marker where the secret was sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from heron.store import Store
from heron.trace import records

# How many of the requests that carried it are read for the conversations they belong to.
NAMED_REQUESTS = 10_000


@dataclass(frozen=True)
class Rewritten:
    """What `rewrite_secret` changed: stored pieces of requests, and the conversations (keys)
    whose recorded requests held the secret."""

    pieces: int
    conversations: tuple[str, ...]


def rewrite_secret(store: Store, probes: Sequence[str], clean: Callable[[str], str]) -> Rewritten:
    """Rewrite with `clean` every stored piece of a request holding one of `probes` (a word of
    each secret, as JSON writes it) that `clean` changes."""
    if not probes:
        return Rewritten(0, ())
    keys = {
        str(row[0])
        for probe in probes
        for row in records.requests_carrying_rows(store, probe, NAMED_REQUESTS)
    }
    blobs = _changed(records.blobs_holding(store, probes), clean)
    requests = _changed(records.inline_requests_holding(store, probes), clean)
    records.rewrite_bodies(store, blobs, requests)
    return Rewritten(len(blobs) + len(requests), tuple(sorted(keys)))


def _changed(rows: list[tuple[int, str]], clean: Callable[[str], str]) -> dict[int, str]:
    out: dict[int, str] = {}
    for row_id, text in rows:
        cleaned = clean(text)
        if cleaned != text:
            out[row_id] = cleaned
    return out
