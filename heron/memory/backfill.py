"""Sentence vectors filled in behind `heron serve`.

A search embeds the messages added since the last one itself, at most `vectors.INLINE_MOST` of
them (about a second); a longer stretch without vectors (the embeddings extra installed on a
long history, a new model, a busy hour of subagents) would hold turns for minutes. The serve
fills it in here: it looks every CHECK_S seconds and, when more are missing than a search
embeds itself, embeds them a small batch at a time on a thread with a connection of its own,
pausing between batches so that turns keep their share of the two cores. `heron memory index`
does the same in the foreground, with a progress bar.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from heron.memory import records, vectors
from heron.store import Store

log = logging.getLogger(__name__)

# Messages a background batch embeds (about a second of one core): a serve that stops waits
# for the batch in hand, no longer.
BATCH = 32
PAUSE_S = 1.0  # between two batches
CHECK_S = 60.0  # between two looks for messages without a vector


async def backfill_vectors(database: Path | str, embedder: Any, every: float | None = None) -> int:
    """Embed the messages of `database` without a vector when more are missing than the next
    search embeds itself; with `every`, look again that often (seconds) until cancelled.
    Returns how many were embedded (when `every` is None)."""
    done, after = 0, 0  # every message up to `after` has its vector (as of the last look)
    while True:
        if await asyncio.to_thread(_behind, database, embedder, after):
            log.info("embedding messages without a sentence vector, in the background")
            while (
                last := await asyncio.to_thread(_one_batch, database, embedder, after)
            ) is not None:
                done, after = done + last[0], last[1]
                await asyncio.sleep(PAUSE_S)
            log.info("%d messages embedded in the background", done)
        if every is None:
            return done
        await asyncio.sleep(every)


def _behind(database: Path | str, embedder: Any, after: int) -> bool:
    """Whether more messages above `after` lack a vector than a search embeds itself (a
    look that stops at the first INLINE_MOST + 1 it finds)."""
    store = Store(database)
    try:
        key = vectors.vector_key(embedder)
        missing = records.unembedded(store, key, after, limit=vectors.INLINE_MOST + 1)
        return len(missing) > vectors.INLINE_MOST
    finally:
        store.close()


def _one_batch(database: Path | str, embedder: Any, after: int) -> tuple[int, int] | None:
    """Embed the oldest batch above `after` without a vector, on a connection of the thread's
    own (a cancelled service leaves the batch in hand to finish and close it): how many, and
    the id of the last; None when none was missing."""
    store = Store(database)
    try:
        return vectors.embed_batch(store, embedder, after, BATCH)
    finally:
        store.close()
