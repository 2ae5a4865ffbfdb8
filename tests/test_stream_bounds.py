"""Streams with bounds, against both fake servers: a reply past its output cap is cut and kept
("length"), a silent stream is cut and retried, a request gives up at its deadline. Timeouts
are small and set by the test; no test asserts how long anything took."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest

from heron.errors import DeadlineExceeded, TransientProviderError
from heron.messages import user
from heron.providers.anthropic import AnthropicProvider
from heron.providers.base import (
    OUTPUT_MARGIN,
    OUTPUT_SLACK,
    Provider,
    RetryPolicy,
    call_with_retries,
)
from heron.providers.openai_compat import OpenAICompatProvider
from heron.request import ChatRequest, StreamEvent
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ENDLESS_TEXT, ServerReply

Serve = Callable[[list[ServerReply]], Any]


@asynccontextmanager
async def _serving(
    fake: type[Any], adapter: Callable[[str], Provider], script: list[ServerReply]
) -> AsyncIterator[tuple[Any, Provider]]:
    with fake(script) as server:
        provider = adapter(server.base_url)
        try:
            yield server, provider
        finally:
            await provider.aclose()


def _anthropic(script: list[ServerReply]) -> Any:
    adapter = partial(AnthropicProvider, "claude-fake", "sk-test")
    return _serving(FakeAnthropicServer, lambda url: adapter(base_url=url), script)


def _openai(script: list[ServerReply]) -> Any:
    adapter = partial(OpenAICompatProvider, "fake-model", "sk-test")
    return _serving(FakeOpenAIServer, lambda url: adapter(base_url=url), script)


WIRES = pytest.mark.parametrize("serve", [_anthropic, _openai], ids=["anthropic", "openai"])


def _request(max_tokens: int = 50, stall: float = 5.0) -> ChatRequest:
    return ChatRequest("m", "sys", [user("hi")], max_tokens=max_tokens, stall_timeout=stall)


@WIRES
async def test_endless_text_is_cut_at_the_output_cap_and_kept(serve: Serve) -> None:
    async with serve([ServerReply(text="Start. ", endless="text")]) as (_, provider):
        events: list[StreamEvent] = []
        reply = await provider.chat(_request(max_tokens=50), events.append)
    assert reply.stop == "length"
    assert reply.text.startswith("Start. " + ENDLESS_TEXT)
    # Read up to the cap (with its margin, in characters at four a token) and no further.
    cap = (50 * OUTPUT_MARGIN + OUTPUT_SLACK) * 4
    assert cap <= len(reply.text) < cap + 2 * len(ENDLESS_TEXT)
    assert "".join(e.text for e in events) == reply.text
    assert reply.usage.output > 50


@WIRES
async def test_endless_tool_arguments_are_cut_and_the_call_dropped(serve: Serve) -> None:
    script = [ServerReply(text="Let me look.", endless="tool_args")]
    async with serve(script) as (_, provider):
        reply = await provider.chat(_request(max_tokens=40))
    assert reply.stop == "length"
    assert reply.tool_calls == []  # its arguments never ended: nothing to run
    assert reply.text == "Let me look."


@WIRES
async def test_a_reply_at_its_cap_is_not_cut(serve: Serve) -> None:
    text = "x" * 200  # 25 deltas of 8 characters, about 50 tokens: at the cap, not past it
    async with serve([ServerReply(text=text, stop=None)]) as (_, provider):
        reply = await provider.chat(_request(max_tokens=50))
    assert reply.stop == "done" and reply.text == text


@WIRES
async def test_a_server_that_never_answers_is_cut_after_the_stall_timeout(serve: Serve) -> None:
    async with serve([ServerReply(hang=True)]) as (server, provider):
        with pytest.raises(TransientProviderError, match=r"sent nothing for 0\.3 s") as caught:
            await provider.chat(_request(stall=0.3))
    # The error names the server and the settings that bound the wait (QA22u L2).
    assert server.base_url in caught.value.summary
    assert "stall_timeout under [agent]" in str(caught.value.hint)
    assert "request_deadline" in str(caught.value.hint)


@WIRES
async def test_a_stream_gone_silent_is_cut_and_retried(serve: Serve) -> None:
    script = [
        ServerReply(text="partial text that will be cut", stall_after_events=4),
        ServerReply(text="second try complete"),
    ]
    retries: list[str] = []
    # 1 s, not less: the complete reply's first byte must come within it on a loaded machine
    # (at 0.3 s a busy CI cut the second try too)
    async with serve(script) as (server, provider):
        reply = await call_with_retries(
            lambda: provider.chat(_request(stall=1.0)),
            RetryPolicy(base_delay=0.01),
            on_retry=lambda error, wait: retries.append(error.summary),
        )
    assert reply.text == "second try complete" and reply.stop == "done"
    assert retries == [f"the model server at {server.base_url} sent nothing for 1 s; cut"]
    assert len(server.requests) == 2


@WIRES
async def test_the_deadline_ends_a_request_that_keeps_stalling(serve: Serve) -> None:
    script = [ServerReply(hang=True)] * 10
    async with serve(script) as (server, provider):
        with pytest.raises(DeadlineExceeded, match=r"did not answer within 0\.5 s") as caught:
            await call_with_retries(
                lambda: provider.chat(_request(stall=0.2)),
                RetryPolicy(attempts=10, base_delay=0.01, deadline=0.5),
            )
    assert "request_deadline" in str(caught.value)  # the hint names the setting
    assert 1 <= len(server.requests) < 10


@WIRES
async def test_the_deadline_cuts_an_attempt_in_flight(serve: Serve) -> None:
    async with serve([ServerReply(hang=True)]) as (_, provider):
        with pytest.raises(DeadlineExceeded):
            await call_with_retries(
                lambda: provider.chat(_request(stall=60)), RetryPolicy(deadline=0.3)
            )
