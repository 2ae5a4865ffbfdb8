"""Sentence vectors filled in behind `heron serve`.

A search embeds the few messages added since the last one itself (`vectors.INLINE_MOST`); a
longer stretch without vectors (the embeddings extra installed on a long history, a new model)
would hold a turn for minutes, so a search leaves it and ranks with the vectors there are. The
serve fills it in here, a small batch at a time on a thread with its own connection to the
database, pausing between batches so that turns keep their share of the two cores; `heron
memory index` does the same in the foreground, with a progress bar.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from heron.memory import vectors
from heron.store import Store

log = logging.getLogger(__name__)

# Messages a background batch embeds (about a second of one core): a serve that stops waits
# for the batch in hand, no longer.
BATCH = 32
PAUSE_S = 1.0  # between two batches


async def backfill_vectors(database: Path | str, embedder: Any) -> int:
    """Embed every message of `database` without a vector, a batch at a time off the event
    loop; how many. Nothing when no more are missing than the next search embeds itself."""
    missing = await asyncio.to_thread(_count, database, embedder)
    if missing <= vectors.INLINE_MOST:
        return 0
    log.info("embedding %d messages without a sentence vector, in the background", missing)
    done = 0
    while batch := await asyncio.to_thread(_one_batch, database, embedder):
        done += batch
        await asyncio.sleep(PAUSE_S)
    log.info("embedded %d messages in the background", done)
    return done


def _count(database: Path | str, embedder: Any) -> int:
    store = Store(database)
    try:
        return vectors.backlog(store, embedder)
    finally:
        store.close()


def _one_batch(database: Path | str, embedder: Any) -> int:
    """Embed the oldest batch of messages without a vector, on a connection of the thread's
    own (a cancelled service leaves the batch in hand to finish and close it); how many."""
    store = Store(database)
    try:
        return vectors.backfill(store, embedder, batches=1, size=BATCH)
    finally:
        store.close()
