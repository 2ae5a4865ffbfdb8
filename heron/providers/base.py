"""What every provider adapter shares: the request it receives, the stream events it emits, the
protocol it implements, and the retry policy around it.

An adapter translates one `ChatRequest` to one wire and back to a `Reply`. It never imports the
store or the engine. `payload(request)` returns the exact JSON body the adapter would send (no
credentials), so traces record what went out and benchmarks can measure prefix stability.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol

from heron.errors import ProviderError
from heron.messages import Message, Reply, dumps


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: a name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

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
    # What is derived from the request once and used again (its encoded body, heron/providers/
    # wire.py): the runner records the body the adapter then posts.
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class StreamEvent:
    """A piece of the reply as it arrives: visible text or reasoning."""

    kind: Literal["text", "thinking"]
    text: str


OnEvent = Callable[[StreamEvent], None]


class Provider(Protocol):
    name: str
    model: str

    def payload(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body this adapter would send for `request`, without credentials."""
        ...

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, error: ProviderError) -> float:
        """Exponential backoff with full jitter; a server's retry-after wins when it says more."""
        backoff = min(self.max_delay, self.base_delay * 2**attempt)
        jittered = random.uniform(backoff / 2, backoff)
        if error.retry_after is not None:
            return min(self.max_delay, max(error.retry_after, 0.0))
        return jittered


async def call_with_retries(
    call: Callable[[], Awaitable[Reply]],
    policy: RetryPolicy,
    *,
    on_retry: Callable[[ProviderError, float], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Reply:
    """Run `call`, retrying rate-limit and transient errors; anything else propagates at once."""
    for attempt in range(policy.attempts):
        try:
            return await call()
        except ProviderError as error:
            if not error.retryable or attempt == policy.attempts - 1:
                raise
            wait = policy.delay(attempt, error)
            if on_retry:
                on_retry(error, wait)
            await sleep(wait)
    raise AssertionError("unreachable")
