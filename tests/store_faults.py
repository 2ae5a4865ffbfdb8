"""A store write that fails the way a full disk does, for tests of what a rollback leaves."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

import pytest

from heron.messages import Message
from heron.store import Store


@dataclass
class AppendFault:
    monkeypatch: pytest.MonkeyPatch
    failed: list[Message] = field(default_factory=list)  # the appends that raised

    def restore(self) -> None:
        self.monkeypatch.setattr(Store, "append", _REAL_APPEND)


_REAL_APPEND = Store.append


def fail_first_tool_call_append(monkeypatch: pytest.MonkeyPatch) -> AppendFault:
    """Make the first append of an assistant message with tool calls raise a disk I/O error
    (its transaction rolls back); `restore()` puts the real append back."""
    fault = AppendFault(monkeypatch)

    def append(self: Store, conversation_id: int, message: Message, **kw: Any) -> Any:
        if message.role == "assistant" and message.tool_calls and not fault.failed:
            fault.failed.append(message)
            raise sqlite3.OperationalError("disk I/O error")
        return _REAL_APPEND(self, conversation_id, message, **kw)

    monkeypatch.setattr(Store, "append", append)
    return fault
