"""What an SQLite home's heron.db holds, read without changing it: the count a person is told
when the home is pointed at PostgreSQL and that file is no longer used (heron/config.py,
`Settings.database`). Nothing here opens it for writing or migrates it."""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from heron.store.jobs import REVIEW
from heron.store.records import internal_sql


@dataclass(frozen=True)
class Held:
    conversations: int  # as `heron conversations list` counts them: internal and empty aside
    jobs: int  # the person's active or paused jobs (the nightly review aside)

    @property
    def empty(self) -> bool:
        return not self.conversations and not self.jobs


def held_in(path: Path) -> Held | None:
    """What `path` holds; None when it is no readable Heron database."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    hidden, params = internal_sql()
    try:
        conversations = conn.execute(
            f"SELECT COUNT(*) FROM conversations WHERE NOT {hidden} AND head_id IS NOT NULL",
            params,
        ).fetchone()[0]
        jobs = 0
        with contextlib.suppress(sqlite3.Error):  # a home made before jobs had none
            jobs = conn.execute(
                "SELECT COUNT(*) FROM jobs WHERE status IN ('active', 'paused') AND mode != ?",
                (REVIEW,),
            ).fetchone()[0]
        return Held(int(conversations), int(jobs))
    except sqlite3.Error:
        return None
    finally:
        conn.close()
