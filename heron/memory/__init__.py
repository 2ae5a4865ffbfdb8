"""Memory the user owns: Markdown entries quoting the user's words, a review queue for what the
agent proposes, forgetting with revocation, and recall over everything said."""

from heron.memory.entries import (
    BadMemoryPath,
    Entry,
    EntryPath,
    MemoryFiles,
    MemoryRefused,
    Source,
)
from heron.memory.section import (
    FrozenMemory,
    HistoryEntry,
    frozen_memory,
    memory_section,
    recent_history_section,
)
from heron.memory.service import AgentCommandRefused, MemoryService, ensure_not_agent

__all__ = [
    "AgentCommandRefused",
    "BadMemoryPath",
    "Entry",
    "EntryPath",
    "FrozenMemory",
    "HistoryEntry",
    "MemoryFiles",
    "MemoryRefused",
    "MemoryService",
    "Source",
    "ensure_not_agent",
    "frozen_memory",
    "memory_section",
    "recent_history_section",
]
