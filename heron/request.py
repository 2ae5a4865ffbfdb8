"""The provider-neutral request: what the loop asks of a model (`ChatRequest`, with the tools it
may call as `ToolSpec`s) and the pieces of the reply it sees as they stream (`StreamEvent`).

It sits below both the context assembly, which builds requests, and the adapters, which send
them, so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from heron.messages import JSONObject, Message, Usage, dumps

# A tool's description says where its programs run after this marker (the sandbox writes it,
# the system prompt reads it back to describe the workspace once).
WHERE_IT_RUNS = "Where it runs: "


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: a name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: JSONObject

    # A spec is made once per tool and sent, estimated and traced every turn: its encodings
    # are kept (the schema is never changed once the spec exists).
    @cached_property
    def parameters_json(self) -> str:
        """`dumps(self.parameters)`."""
        return dumps(self.parameters)

    @cached_property
    def json(self) -> str:
        """The spec as canonical JSON of {"description", "name", "parameters"}."""
        head = dumps({"description": self.description, "name": self.name})[:-1]
        return head + ',"parameters":' + self.parameters_json + "}"


@dataclass(frozen=True)
class ChatRequest:
    model: str
    system: str
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 4096
    # Seconds the stream may stay silent (no headers, no event) before it is cut and retried.
    stall_timeout: float = 60.0
    # What is derived from the request once and used again (its encoded body, heron/providers/
    # wire.py): the runner records the body the adapter then posts.
    memo: dict[str, tuple[object, object]] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class StreamEvent:
    """A piece of the reply as it arrives: visible text or reasoning; "retry": the stream was
    cut and the call starts again, so what follows replaces the call's text shown so far,
    which the event's text is (a channel that holds the reply takes it back); or
    "usage": the token counts the provider has sent so far (no text: no channel shows it; the
    runner keeps it for a call stopped before its end)."""

    kind: Literal["text", "thinking", "retry", "usage"]
    text: str
    usage: Usage | None = None


OnEvent = Callable[[StreamEvent], None]
