"""A server's Retry-After is honoured up to the request's deadline, however long: a 429 that
asks for 120 s is tried again after 120 s, not four times after 30 s each. One that asks for
more than the deadline leaves fails at once, saying when to try again."""

from __future__ import annotations

import pytest

from heron.errors import DeadlineExceeded, RateLimited
from heron.messages import Reply, Text, Usage
from heron.providers.base import RetryPolicy, call_with_retries


class Sleeps:
    """A fake asyncio.sleep: records the waits, takes no time."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def limited(seconds: float) -> RateLimited:
    return RateLimited("HTTP 429: slow down", status=429, retry_after=seconds, hint="wait")


async def test_a_long_retry_after_is_waited_in_full():
    answers: list[Exception | Reply] = [limited(120), Reply([Text("ok")], "done", Usage(1, 1))]

    async def call() -> Reply:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sleeps = Sleeps()
    reply = await call_with_retries(call, RetryPolicy(deadline=600), sleep=sleeps)
    assert reply.text == "ok"
    assert sleeps.delays == [120.0]


async def test_a_retry_after_past_the_deadline_fails_at_once_saying_when():
    calls = 0

    async def call() -> Reply:
        nonlocal calls
        calls += 1
        raise limited(900)

    sleeps = Sleeps()
    with pytest.raises(DeadlineExceeded) as caught:
        await call_with_retries(call, RetryPolicy(deadline=600), sleep=sleeps)
    assert calls == 1 and sleeps.delays == []  # no retry spent too early, no wait for nothing
    said = str(caught.value)
    assert "asks to wait 900 s" in said and "600 s" in said
    assert "try again in 15 minutes" in said.lower()
    assert "request_deadline" in said
    assert caught.value.status == 429
