"""Rows of the store as typed records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from heron.messages import Message, Usage


@dataclass(frozen=True)
class Conversation:
    id: int
    key: str
    agent: str
    title: str | None
    head_id: int | None
    epoch: int
    created: float
    updated: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: int
    parent_id: int | None
    turn_id: int | None
    kind: str
    message: Message
    sent: Message | None
    created: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def role(self) -> str:
        return self.message.role

    @property
    def wire(self) -> Message:
        """What the model was sent for this row (the runtime block included)."""
        return self.sent or self.message


@dataclass(frozen=True)
class Turn:
    id: int
    conversation_id: int
    run_id: str
    user_message_id: int | None
    status: str
    stop_reason: str | None
    provider: str | None
    model: str | None
    usage: Usage
    model_calls: int
    tool_calls: int
    system_fingerprint: str | None
    error: str | None
    started: float
    ended: float | None
