"""A server whose real window is smaller than Heron's profile (an ollama, llama.cpp or vLLM
server with a few thousand tokens under the 128,000-token `default` profile): its overflow
error is recognised in each server's words, the window it states is read, the turn compacts to
it and runs again, later turns of the process fit it from the start, and when nothing fits the
error names the setting to change, with the server's number."""

from __future__ import annotations

import json
from typing import Any

import pytest

from heron.agent.engine import Engine
from heron.agent.turn import TurnHooks
from heron.config import Settings
from heron.errors import ContextOverflow
from heron.messages import Message, Text
from heron.providers.anthropic import AnthropicProvider
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.overflow import is_overflow, stated_limit
from heron.request import ChatRequest
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

WINDOW = 9_000
BLOB = " ".join(f"word{i}" for i in range(1_000))  # about 6 kB, as in QA's repro


def _answer(body: dict[str, Any]) -> ServerReply:
    return ServerReply(text="## Facts\n- the person sent blobs to remember")


@pytest.mark.parametrize("dialect", ["openai", "llamacpp"])
async def test_turns_past_a_smaller_server_window_compact_to_the_window_it_states(dialect):
    with FakeOpenAIServer(_answer, window=WINDOW, dialect=dialect) as srv:  # type: ignore[arg-type]
        provider = OpenAICompatProvider("fake-model", "key", base_url=srv.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            results = [await engine.turn("ovf", f"Remember blob {i}: {BLOB}") for i in range(5)]
            refused_by_then = srv.over_window
            later = await engine.turn("ovf", f"Remember blob 5: {BLOB}")
        assert [str(r.run.error) for r in (*results, later) if not r.ok] == []
        assert all(r.ok for r in results) and later.ok
        assert refused_by_then == 1  # once: the window stated is then the process's
        assert srv.over_window == 1  # the later turn fit from the start
        last = srv.requests[-1]
        assert last["max_tokens"] <= WINDOW // 4  # the reply's room fits the window too
        # A new process goes on from the compacted record (and would learn the window again
        # from a refusal).
        provider = OpenAICompatProvider("fake-model", "key", base_url=srv.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            again = await engine.turn("ovf", f"Remember blob 6: {BLOB}")
        assert again.ok, again.run.error


async def test_the_person_is_told_the_window_the_server_stated_and_the_setting():
    told: list[str] = []
    hooks = TurnHooks(on_notice=told.append)
    with FakeOpenAIServer(_answer, window=WINDOW, dialect="llamacpp") as srv:
        provider = OpenAICompatProvider("fake-model", "key", base_url=srv.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            for i in range(4):
                await engine.turn("ovf", f"Remember blob {i}: {BLOB}", hooks)
    assert srv.over_window == 1
    (notice,) = [t for t in told if "window" in t]
    assert "window is 9,000 tokens, not the 128,000 Heron assumed" in notice
    assert 'context_window under [models."fake-model"] in config.toml to 9000' in notice


async def test_the_adapter_says_the_stated_window_and_which_setting_to_change():
    with FakeOpenAIServer(_answer, window=1_000, dialect="llamacpp") as srv:
        provider = OpenAICompatProvider("fake-model", "key", base_url=srv.base_url)
        request = ChatRequest("fake-model", "", [Message("user", (Text(BLOB * 2),))])
        with pytest.raises(ContextOverflow) as raised:
            await provider.chat(request)
        await provider.aclose()
    error = raised.value
    assert error.limit == 1_000
    assert "exceeds the available context size (1000 tokens)" in str(error)
    assert 'context_window under [models."fake-model"] in config.toml to 1000' in str(error)
    assert "HERON_CONTEXT_WINDOW=1000" in str(error)


async def test_a_window_too_small_for_anything_names_the_setting_and_the_number():
    with FakeOpenAIServer(_answer, window=1_500, dialect="llamacpp") as srv:
        provider = OpenAICompatProvider("fake-model", "key", base_url=srv.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            result = await engine.turn("tiny", f"hello {BLOB}")
    assert not result.ok
    error = str(result.run.error)
    assert srv.over_window == 1  # refused once; what cannot fit 1,500 tokens is not sent again
    assert "do not fit the model's window of 1,500 tokens" in error
    assert 'context_window under [models."fake-model"] in config.toml' in error


async def test_anthropic_prompt_too_long_states_its_window_and_the_turn_fits_it():
    def answer(body: dict[str, Any]) -> ServerReply:
        tokens = len(json.dumps(body)) // 4
        if tokens > WINDOW:
            said = f"prompt is too long: {tokens} tokens > {WINDOW} maximum"
            error = {"type": "invalid_request_error", "message": said}
            return ServerReply(status=400, error_body={"type": "error", "error": error})
        return _answer(body)

    server = FakeAnthropicServer(answer)
    provider = AnthropicProvider("claude-sonnet-4-5", "key", base_url=server.start(), timeout=10)
    try:
        async with Engine.open(Settings.load(), provider=provider) as engine:
            results = [await engine.turn("a", f"Remember blob {i}: {BLOB}") for i in range(5)]
    finally:
        server.stop()
    assert [r.run.error for r in results if not r.ok] == []
    sizes = [len(json.dumps(b)) // 4 for b in server.requests]
    assert sum(size > WINDOW for size in sizes) == 1  # refused once, then fitted


@pytest.mark.parametrize(
    ("status", "said", "limit"),
    [
        (400, "This model's maximum context length is 4096 tokens. However, ...", 4096),
        (400, "request (4476 tokens) exceeds the available context size (4096 tokens)", 4096),
        (400, '{"type": "exceed_context_size_error", "n_ctx": 8192}', 8192),
        (500, "the request exceeds the available context size, try increasing it", None),
        (400, "the input length exceeds the context length", None),
        (400, "prompt is too long: 208310 tokens > 200000 maximum", 200_000),
    ],
)
def test_each_servers_overflow_is_recognised_with_its_stated_window(status, said, limit):
    assert is_overflow(status, said)
    assert stated_limit(said) == limit


def test_other_errors_are_not_overflows():
    assert not is_overflow(400, "messages: roles must alternate")
    assert not is_overflow(429, "maximum context length is 4096 tokens")


def test_the_stated_window_rides_on_the_error():
    error = ContextOverflow("x", limit=4096, status=400)
    assert error.limit == 4096 and error.status == 400


async def test_the_notice_says_compaction_did_not_happen_when_it_did_not():
    """The notice said "the conversation was compacted to fit it" though nothing was folded
    (both summaries failed, or nothing could be), and the turn then failed (QA22x L3)."""
    told: list[str] = []
    hooks = TurnHooks(on_notice=told.append)
    with FakeOpenAIServer(_answer, window=1_500, dialect="llamacpp") as srv:
        provider = OpenAICompatProvider("fake-model", "key", base_url=srv.base_url)
        async with Engine.open(Settings.load(), provider=provider) as engine:
            result = await engine.turn("tiny", f"hello {BLOB}", hooks)
    assert not result.ok
    (notice,) = [t for t in told if "window is 1,500 tokens" in t]
    assert "compacted to fit" not in notice
    assert "the turn runs again built for it; nothing was compacted (everything since" in notice
    assert 'context_window under [models."fake-model"] in config.toml to 1500' in notice
