"""Persistence: one SQLite file holds conversations, the message tree, turns and traces."""

from heron.store.db import HEAD, BranchRow, Store
from heron.store.records import Conversation, StoredMessage, Turn

__all__ = ["HEAD", "BranchRow", "Conversation", "Store", "StoredMessage", "Turn"]
