"""What an SQLite home's heron.db holds, read without changing it: the count a person is told
when the home is pointed at PostgreSQL and that file is no longer used (heron/config.py,
`Settings.database`). Nothing here opens it for writing or migrates it.

A home whose heron.db was copied into PostgreSQL (`heron store copy`, heron/store/copy.py) has
a mark beside it, `heron.db.copied`: where it went, when, and the newest message it carried.
That notice is not given for the database it names while heron.db holds nothing newer."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from heron.store.jobs import REVIEW
from heron.store.records import internal_sql

if TYPE_CHECKING:
    from heron.store.copy import Copied


@dataclass(frozen=True)
class Held:
    conversations: int  # as `heron conversations list` counts them: internal and empty aside
    jobs: int  # the person's active or paused jobs (the nightly review aside)
    last_message: int = 0  # the newest message's id: said after a copy, or not

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
        last = conn.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0]
        return Held(int(conversations), int(jobs), int(last))
    except sqlite3.Error:
        return None
    finally:
        conn.close()


COPIED_NOTE = "heron.db.copied"  # beside heron.db: where `heron store copy` took it


@dataclass(frozen=True)
class CopyMark:
    """What `heron store copy` left beside heron.db."""

    target: str  # the database's URL without its password, the schema in its options
    at: float  # when (Unix time)
    last_message: int  # the newest message id it carried

    def covers(self, url: str, held: Held) -> bool:
        """Whether the copy went to `url` (redacted as kept) and heron.db holds no message
        said after it: then nothing of heron.db is missing there."""
        return self.target == url and held.last_message <= self.last_message


def mark_copied(db: Path, copied: Copied) -> Path:
    """The mark beside `db` that its record went to `copied.target`; its path."""
    note = db.with_name(COPIED_NOTE)
    body = {
        "target": copied.target,
        "schema": copied.schema,
        "at": copied.at,
        "last_message": copied.last_message,
        "rows": copied.counts,
    }
    note.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    return note


def copy_mark(db: Path) -> CopyMark | None:
    """The mark beside `db`, None when there is none (or it is unreadable: the notice is then
    given, which is the safe side)."""
    try:
        data = json.loads(db.with_name(COPIED_NOTE).read_text(encoding="utf-8"))
        return CopyMark(str(data["target"]), float(data["at"]), int(data["last_message"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
