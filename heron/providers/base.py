"""What every provider adapter shares: the protocol it implements and the retry policy around
it (the request it receives and the events it streams are in heron/request.py).

An adapter translates one `ChatRequest` to one wire and back to a `Reply`. It never imports the
store or the engine. `payload(request)` returns the exact JSON body the adapter would send (no
credentials), so traces record what went out and benchmarks can measure prefix stability.

Every stream is bounded three ways: an adapter stops reading a reply that runs past its output
cap (`OutputMeter`: the reply is kept, cut, with stop "length"); a stream silent for the
request's `stall_timeout` is cut and retried (`within_stall`); and `call_with_retries` gives up
at the policy's `deadline`, however many attempts that leaves (`DeadlineExceeded`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from heron.errors import DeadlineExceeded, ProviderError, TransientProviderError
from heron.messages import JSONObject, Reply
from heron.providers.endpoint import Endpoint
from heron.request import ChatRequest, OnEvent

T = TypeVar("T")


class Provider(Protocol):
    name: str
    model: str

    def payload(self, request: ChatRequest) -> JSONObject:
        """The JSON body this adapter would send for `request`, without credentials."""
        ...

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0
    deadline: float = 600.0  # seconds for one request, all its attempts and waits included
    stall_timeout: float = 60.0  # what the runner puts in each ChatRequest

    def delay(self, attempt: int, error: ProviderError) -> float:
        """Exponential backoff with full jitter, from the error's own first wait when it has
        one (an overloaded service); a server's Retry-After as it says, however long: the
        caller gives up at once when it ends past the deadline (`call_with_retries`)."""
        if error.retry_after is not None:
            return max(error.retry_after, 0.0)
        base = self.base_delay if error.backoff is None else error.backoff
        backoff = min(self.max_delay, base * 2**attempt)
        return random.uniform(backoff / 2, backoff)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a server asks us to wait, from `retry-after-ms` or `retry-after` (in seconds; an
    HTTP date is ignored): the same headers on both wires."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale)
        except ValueError:
            continue
    return None


async def call_with_retries(
    call: Callable[[], Awaitable[Reply]],
    policy: RetryPolicy,
    *,
    on_retry: Callable[[ProviderError, float], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Reply:
    """Run `call`, retrying rate-limit and transient errors; anything else propagates at once.
    Past `policy.deadline` seconds the attempt in flight is cancelled and `DeadlineExceeded`
    ends the request; a wait that would end past it is not started."""
    clock = asyncio.get_running_loop().time
    end = clock() + policy.deadline
    for attempt in range(policy.attempts):
        try:
            async with asyncio.timeout_at(end):
                return await call()
        except TimeoutError as error:
            if clock() < end:
                raise  # not the deadline's: something inside timed out on its own
            raise _late(policy, None) from error
        except ProviderError as error:
            if not error.retryable or attempt == policy.attempts - 1:
                raise
            wait = policy.delay(attempt, error)
            if clock() + wait >= end:
                if error.retry_after is not None:
                    raise _asked_too_long(policy, error, wait) from error
                raise _late(policy, error) from error
            if on_retry:
                on_retry(error, wait)
            await sleep(wait)
    raise AssertionError("unreachable")


def _late(policy: RetryPolicy, last: ProviderError | None) -> DeadlineExceeded:
    why = f" (last error: {last})" if last is not None else ""
    return DeadlineExceeded(
        f"the model did not answer within {policy.deadline:g} s{why}",
        hint="The model server may be overloaded or stuck; try again later, or raise "
        "request_deadline under [agent] in config.toml.",
    )


def _asked_too_long(policy: RetryPolicy, error: ProviderError, wait: float) -> DeadlineExceeded:
    """The server's Retry-After ends past the request's deadline: waiting is pointless, and
    so is trying sooner than it said."""
    return DeadlineExceeded(
        f"{error.summary}; the server asks to wait {wait:g} s before trying again, longer "
        f"than this request's deadline of {policy.deadline:g} s",
        status=error.status,
        body=error.body,
        retry_after=error.retry_after,
        hint=f"Try again in {_minutes(wait)}, or raise request_deadline under [agent] in "
        "config.toml to let Heron wait for it.",
    )


def _minutes(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return "1 minute" if minutes == 1 else f"{minutes} minutes"


async def within_stall(
    stream: AsyncIterator[T], seconds: float, endpoint: Endpoint
) -> AsyncIterator[T]:
    """The stream's items, or TransientProviderError (retried) once it is silent for
    `seconds`: a server that keeps the connection open and sends nothing is cut."""
    iterator = stream.__aiter__()
    while True:
        try:
            async with asyncio.timeout(seconds):
                item = await iterator.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError as error:
            raise stalled(seconds, endpoint) from error
        yield item


def stalled(seconds: float, endpoint: Endpoint) -> TransientProviderError:
    """A silent server cut: retried; the hint, shown once the retries are used up, names the
    settings that bound the wait, since a slow model may need a longer one."""
    return TransientProviderError(
        f"the model server at {endpoint.named} sent nothing for {seconds:g} s; cut",
        hint="The server may be stuck or overloaded: try again later. A model that thinks "
        "long before it answers needs a larger stall_timeout under [agent] in config.toml "
        f"(now {seconds:g} s); request_deadline there bounds the whole request, retries "
        "included.",
    )


# The server enforces max_tokens itself; the meter is the client's own bound for one that does
# not (an endless stream of text or tool-call arguments). A delta carries at least one token and
# a token about four characters; the margin keeps an honest reply that ends at the cap whole.
OUTPUT_MARGIN = 1.25
OUTPUT_SLACK = 64


@dataclass
class OutputMeter:
    """Counts a reply's output as its deltas arrive (text, reasoning, tool-call arguments)."""

    max_tokens: int
    deltas: int = 0
    chars: int = 0

    def add(self, text: str) -> bool:
        """Count one delta; True once the reply has passed its cap (stop reading)."""
        if text:
            self.deltas += 1
            self.chars += len(text)
        return self.over

    @property
    def tokens(self) -> int:
        return max(self.deltas, self.chars // 4)

    @property
    def over(self) -> bool:
        return self.tokens > self.max_tokens * OUTPUT_MARGIN + OUTPUT_SLACK
