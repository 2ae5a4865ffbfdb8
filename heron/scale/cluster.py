"""Where the workers of one PostgreSQL store meet: the DBOS system schema, the queue, the
notification channel; all derived from the store's URL, so one URL is all a worker is told.

A URL that sets `search_path` (a tenant's schema, or a test's) gets a DBOS schema and a
channel of its own: two homes on one database never see each other's workflows or events.
"""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

from heron.errors import ConfigError
from heron.store.pg import is_url

QUEUE = "heron_turns"
WORKFLOW = "heron_message"
# Seconds between a worker's looks at the queue: the most a turn waits for a free worker
# once its conversation is free (DBOS polls; it has no push for queues).
POLL_S = 0.05
# Turns one worker runs at once, across conversations: enough for a slow model's turns to
# overlap (they mostly wait), and a bound so that one worker does not take every queued turn.
WORKER_TURNS = 600


class TurnQueue(Protocol):
    """What the face and the workers need of DBOS to enqueue and cancel turns (a
    `DBOSClient`)."""

    async def enqueue_async(self, options: Any, *args: Any) -> Any: ...

    async def cancel_workflow_async(self, workflow_id: str) -> None: ...


@dataclass(frozen=True)
class Cluster:
    url: str  # the store's URL (psycopg)
    schema: str  # the store's schema: search_path, else public

    @property
    def dbos_url(self) -> str:
        """The same database for DBOS (SQLAlchemy names its psycopg 3 driver)."""
        return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", self.url)

    @property
    def dbos_schema(self) -> str:
        return "dbos" if self.schema == "public" else f"{self.schema}_dbos"

    @property
    def channel(self) -> str:
        """The NOTIFY channel of this store's turns (channels are per database, not schema)."""
        return f"heron_{self.schema}"[:63]


def cluster_of(database: object) -> Cluster:
    """The cluster of a store target; a clear error for SQLite, which has no workers."""
    if not is_url(database):
        raise ConfigError(
            "workers need PostgreSQL: this home's store is the SQLite file "
            f"{database}; one process serves it (heron serve without --workers).",
            hint='Set HERON_DATABASE_URL or [store] url = "postgresql://..." in config.toml '
            "(docs/scale.md).",
        )
    url = str(database)
    found = re.search(r"search_path(?:%3D|=)([A-Za-z_][A-Za-z0-9_]*)", unquote(url))
    return Cluster(url, found.group(1) if found else "public")


def executor_id() -> str:
    """This worker's name in DBOS: unique per process, so that a dead one's turns can be
    told apart and recovered by the others."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


_last_ns = 0


def message_id() -> str:
    """A new message's workflow id, in the order this process made them: DBOS runs a
    partition by enqueue time in milliseconds, then by workflow id, so two messages of one
    conversation enqueued in the same millisecond would otherwise run in a random order.
    The time (nanoseconds, fixed-width hex) comes first; a random tail keeps faces apart."""
    global _last_ns
    _last_ns = max(time.time_ns(), _last_ns + 1)
    return f"{_last_ns:016x}{uuid.uuid4().hex[:16]}"


def enqueue_options(workflow_id: str, key: str) -> dict[str, str]:
    """How a face enqueues a message: once under its id, in its conversation's partition
    (DBOS refuses deduplication ids on partitioned queues; the workflow id is what makes a
    second enqueue of the same message return the first)."""
    return {
        "workflow_name": WORKFLOW,
        "queue_name": QUEUE,
        "workflow_id": workflow_id,
        "queue_partition_key": key,
    }
