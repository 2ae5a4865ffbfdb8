"""The Anthropic adapter against the fake Messages API server, through the real SDK."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from heron.errors import (
    AuthError,
    ContextOverflow,
    FatalProviderError,
    Overloaded,
    RateLimited,
    TransientProviderError,
    UnknownModel,
)
from heron.messages import (
    File,
    Message,
    Reply,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Usage,
    assistant,
    user,
)
from heron.providers.anthropic import (
    AnthropicProvider,
    _Assembler,
    build_payload,
    thinking_state,
)
from heron.providers.base import RetryPolicy, call_with_retries
from heron.request import ChatRequest, StreamEvent, ToolSpec
from heron.testing.anthropic_cache import BlockCache
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.script import Script, ServerReply

MODEL = "claude-test-1"
KEY = "sk-test-key-123"
READ = ToolSpec("read", "Read a file.", {"type": "object", "properties": {"path": {}}})

Connect = Callable[[Script], tuple[FakeAnthropicServer, AnthropicProvider]]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Start a fake server for a script and point a provider at it; both are torn down after."""
    made: list[tuple[FakeAnthropicServer, AnthropicProvider]] = []

    def _connect(script: Script) -> tuple[FakeAnthropicServer, AnthropicProvider]:
        server = FakeAnthropicServer(script)
        provider = AnthropicProvider(MODEL, KEY, base_url=server.start(), timeout=10)
        made.append((server, provider))
        return server, provider

    yield _connect
    for server, provider in made:
        await provider.aclose()
        server.stop()


def request(*messages: Message, system: str = "You are terse.") -> ChatRequest:
    return ChatRequest(MODEL, system, list(messages) or [user("hi")], [READ], max_tokens=512)


class Sleeps:
    """A fake asyncio.sleep that records the delays it was asked for."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


# ---- replies -----------------------------------------------------------------------------------


async def test_streamed_text_reply(connect: Connect) -> None:
    reply = ServerReply(
        text="Hello there, general Kenobi.",
        chunk_size=5,
        input_tokens=100,
        cached_tokens=60,
        cache_write_tokens=10,
        output_tokens=7,
    )
    server, provider = connect([reply])
    events: list[StreamEvent] = []

    result = await provider.chat(request(), events.append)

    # The usage as it comes: the input's at message_start, the whole at message_delta.
    usage = [e.usage for e in events if e.kind == "usage"]
    events = [e for e in events if e.kind != "usage"]
    assert usage[0] is not None and usage[0].input == 100 and usage[-1] == result.usage
    assert [e.text for e in events] == ["Hello", " ther", "e, ge", "neral", " Keno", "bi."]
    assert {e.kind for e in events} == {"text"}
    assert result.text == "Hello there, general Kenobi."
    assert result.stop == "done"
    assert result.usage == Usage(input=100, output=7, cache_read=60, cache_write=10)
    sent_headers = server.headers[0]
    # The key goes in a header (x-api-key or a bearer token, by SDK version), never the body.
    assert KEY in (sent_headers.get("x-api-key"), sent_headers.get("authorization", "")[7:])
    assert KEY not in json.dumps(server.requests[0])
    assert server.requests[0] == provider.payload(request())


async def test_cache_read_is_estimated_from_the_shared_prefix(connect: Connect) -> None:
    _, provider = connect([ServerReply(text="one"), ServerReply(text="two")])
    first = await provider.chat(request(user("x" * 400)))
    second = await provider.chat(request(user("x" * 400), assistant("one"), user("more")))

    assert first.usage.cache_read == 0
    assert second.usage.cache_read > 100  # the 400-char message is in the shared prefix
    assert second.usage.input > second.usage.cache_read


async def test_tool_use_input_is_assembled_from_split_deltas(connect: Connect) -> None:
    args = {"path": "notes/a b.txt", "lines": [1, 2, 3], "opts": {"raw": True, "q": 'é"}'}}
    server, provider = connect([ServerReply(tool_calls=[("toolu_1", "read", args)], chunk_size=3)])

    result = await provider.chat(request())

    assert result.stop == "tool"
    assert result.tool_calls == [ToolCall("toolu_1", "read", args)]
    assert server.requests[0]["tools"] == [
        {
            "name": "read",
            "description": "Read a file.",
            "input_schema": READ.parameters,
            "cache_control": {"type": "ephemeral"},  # the last tool: breakpoint 1
        }
    ]


async def test_max_tokens_stop_is_length(connect: Connect) -> None:
    _, provider = connect([ServerReply(text="cut sh", stop="max_tokens")])
    assert (await provider.chat(request())).stop == "length"


async def test_thinking_round_trips_with_a_byte_exact_signature(connect: Connect) -> None:
    signature = "EqQBCkgIARAB+/5x\u00e9\\n =="  # odd bytes on purpose: nothing may normalise them
    first = ServerReply(
        thinking="Let me look.", thinking_signature=signature, tool_calls=[("read", {"path": "a"})]
    )
    server, provider = connect([first, ServerReply(text="done")])
    events: list[StreamEvent] = []

    reply = await provider.chat(request(user("read a")), events.append)
    events = [e for e in events if e.kind != "usage"]
    call = reply.tool_calls[0]
    result = Message("user", [ToolResult(call.id, "contents of a")])
    await provider.chat(request(user("read a"), reply.message, result))

    assert events[0] == StreamEvent("thinking", "Let me l")
    assert isinstance(reply.parts[0], Thinking) and reply.parts[0].provider == "anthropic"
    sent = server.requests[1]["messages"]
    assert sent[1]["content"][0] == {
        "type": "thinking",
        "thinking": "Let me look.",
        "signature": signature,
    }
    assert sent[2]["content"][0]["tool_use_id"] == call.id


async def test_breakpoints_at_tools_system_previous_request_and_end(connect: Connect) -> None:
    server, provider = connect([ServerReply(text="ok")])
    history = [
        user("first"),
        Message("assistant", [Text("calling"), ToolCall("t1", "read", {"path": "a"})]),
        Message("user", [ToolResult("t1", "A"), Text("and now?")]),
    ]
    await provider.chat(request(*history))

    body = server.requests[0]
    marked = sorted(path for path, _ in _walk(body) if path.endswith("cache_control"))
    assert marked == [
        "messages.0.content.0.cache_control",  # where the previous request ended
        "messages.2.content.1.cache_control",  # the end
        "system.0.cache_control",
        "tools.0.cache_control",
    ]
    assert body["messages"][2]["content"][1] == {
        "type": "text",
        "text": "and now?",
        "cache_control": {"type": "ephemeral"},
    }


def test_a_first_request_has_no_breakpoint_for_a_previous_one() -> None:
    body = build_payload(request(user("hello")))
    marked = sorted(path for path, _ in _walk(body) if path.endswith("cache_control"))
    assert marked == [
        "messages.0.content.0.cache_control",
        "system.0.cache_control",
        "tools.0.cache_control",
    ]


def _parallel_turn(n: int) -> list[Message]:
    calls = [ToolCall(f"t{i}", "read", {"path": f"f{i}"}) for i in range(n)]
    return [
        Message("assistant", calls),
        Message("user", [ToolResult(c.id, f"contents {c.id} " + "z" * 200) for c in calls]),
        Message("assistant", [Text("Read them all.")]),
    ]


def test_a_reply_with_twelve_parallel_calls_still_reads_the_previous_request() -> None:
    """12 calls and their results are 24 blocks, past the ~20-block lookback from the last
    breakpoint: the breakpoint where the previous request ended finds its entry."""
    cache = BlockCache()
    history = [user("x" * 4000)]
    first = cache.use(build_payload(request(*history)))
    history += [Message("assistant", [Text("On it.")]), user("read twelve files")]
    second = cache.use(build_payload(request(*history)))
    history += _parallel_turn(12)[:2]
    third = cache.use(build_payload(request(*history)))

    assert first.read == 0
    assert second.read == first.written  # everything the first request wrote
    assert third.read == second.read + second.written  # the whole previous request
    assert third.uncached == 0 and third.breakpoints == 4


def test_a_new_system_prompt_still_reads_the_tool_schemas() -> None:
    cache = BlockCache()
    tools = [ToolSpec(f"tool{i}", "Does a thing. " * 40, READ.parameters) for i in range(5)]
    history = [user("hello")]
    cache.use(build_payload(ChatRequest(MODEL, "Summary A.", history, tools)))
    after = cache.use(build_payload(ChatRequest(MODEL, "Summary B.", history, tools)))

    schemas = sum(
        len(json.dumps(t)) // 4 for t in build_payload(ChatRequest(MODEL, "", [], tools))["tools"]
    )
    assert after.read >= schemas * 0.9  # the tool schemas, read: only the system is written


def test_neighbouring_text_parts_are_separated_by_a_blank_line() -> None:
    """The runtime block (or a checkpoint, or an attachment's note) after the user's words
    reads as its own paragraph, as on the OpenAI-compatible wire; no empty block is sent."""
    runtime = "[Runtime context: metadata only, not instructions]\nTime: 09:41"
    message = Message("user", [Text("the owner is PERSON-ONE"), Text("  "), Text(runtime)])
    body = build_payload(request(message))

    content = body["messages"][0]["content"]
    assert [b["text"] for b in content] == ["the owner is PERSON-ONE\n\n" + runtime]


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}" if path else key)
            yield (f"{path}.{key}" if path else key), item
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}.{i}")


# ---- payload -----------------------------------------------------------------------------------


def test_payload_maps_every_part_kind() -> None:
    png = b"\x89PNG\r\n"
    history = [
        Message("user", [Text("look "), Text("here"), Text(""), File("image/png", png)]),
        Message(
            "assistant",
            [
                Thinking("mine", thinking_state("sig"), "anthropic"),
                Thinking("theirs", "opaque", "openai"),
                Thinking(None, thinking_state(redacted_data="blob"), "anthropic"),
                Text("   "),
                ToolCall("t1", "read", {"path": "a"}),
            ],
        ),
        Message("user", [Text("also"), ToolResult("t1", "boom", is_error=True)]),
    ]
    body = build_payload(request(*history))

    assert body["model"] == MODEL and body["max_tokens"] == 512 and body["stream"] is True
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "look \n\nhere"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"},
            "cache_control": {"type": "ephemeral"},  # where the previous request ended
        },
    ]
    assert body["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "mine", "signature": "sig"},
        {"type": "redacted_thinking", "data": "blob"},
        {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}},
    ]
    # Tool results lead the user message, as the API requires.
    assert body["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": "boom",
        "is_error": True,
    }


def test_payload_drops_empty_messages_and_merges_neighbours() -> None:
    history = [user("a"), Message("assistant", [Thinking("x", "s", "openai")]), user("b")]
    body = build_payload(request(*history, system=""))

    assert "system" not in body
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                # "a" ended the previous request (the dropped reply followed it)
                {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}},
            ],
        }
    ]


def test_payload_sends_pdf_and_text_files_as_documents() -> None:
    body = build_payload(
        request(
            Message("user", [File("application/pdf", b"%PDF", "r.pdf"), File("text/plain", b"hi")])
        )
    )
    pdf, text = body["messages"][0]["content"]
    assert pdf["type"] == "document" and pdf["title"] == "r.pdf"
    assert pdf["source"] == {"type": "base64", "media_type": "application/pdf", "data": "JVBERg=="}
    assert text["source"] == {"type": "text", "media_type": "text/plain", "data": "hi"}


# ---- failures ----------------------------------------------------------------------------------


async def test_cut_stream_is_transient(connect: Connect) -> None:
    _, provider = connect([ServerReply(text="a long answer that never ends", cut_after_events=3)])
    events: list[StreamEvent] = []
    with pytest.raises(TransientProviderError) as caught:
        await provider.chat(request(), events.append)
    assert caught.value.__cause__ is not None
    assert events  # it did get partway before the cut


def test_stream_ending_without_message_stop_is_transient() -> None:
    # A cleanly closed body that simply stops (no chunked-encoding error) must still fail.
    assembler = _Assembler(None)
    usage = SimpleNamespace(input_tokens=3, output_tokens=1)
    assembler.feed(SimpleNamespace(type="message_start", message=SimpleNamespace(usage=usage)))
    with pytest.raises(TransientProviderError, match="message_stop"):
        assembler.reply()


async def test_malformed_event_is_transient(connect: Connect) -> None:
    _, provider = connect([ServerReply(text="hello", malformed_event=True)])
    with pytest.raises(TransientProviderError, match="malformed"):
        await provider.chat(request())


async def test_rate_limit_carries_retry_after_and_is_retried(connect: Connect) -> None:
    limited = ServerReply(status=429, headers={"retry-after": "1"})
    _, provider = connect([limited, limited, ServerReply(text="finally")])

    with pytest.raises(RateLimited) as caught:
        await provider.chat(request())
    assert caught.value.retry_after == 1.0
    assert caught.value.status == 429

    sleeps = Sleeps()
    reply = await call_with_retries(lambda: provider.chat(request()), RetryPolicy(), sleep=sleeps)
    assert reply.text == "finally"
    assert sleeps.delays == [1.0]


async def test_overloaded_529_says_the_service_is_overloaded_and_waits_longer(
    connect: Connect,
) -> None:
    server, provider = connect([ServerReply(status=529)] * 3)
    sleeps = Sleeps()
    with pytest.raises(Overloaded) as caught:
        await call_with_retries(
            lambda: provider.chat(request()), RetryPolicy(attempts=3), sleep=sleeps
        )
    error = caught.value
    assert error.retry_after is None and error.retryable
    assert "overloaded_error" in (error.body or "")
    assert error.hint is not None and "Anthropic's service is overloaded" in error.hint
    assert "rate limit" not in error.hint and "account" not in error.hint
    assert len(server.requests) == 3
    # An overload lasts longer than a blip: seconds between tries, not half a second.
    assert sleeps.delays[0] >= 2.0 and sum(sleeps.delays) >= 6.0


async def test_a_stream_cut_mid_reply_is_not_a_server_that_cannot_be_reached(
    connect: Connect,
) -> None:
    _, provider = connect(
        [ServerReply(text="partial anthropic reply, on and on", chunk_size=4, cut_after_events=6)]
    )
    with pytest.raises(TransientProviderError) as caught:
        await provider.chat(request())
    said = str(caught.value)
    assert "was cut mid-reply" in said
    assert "cannot connect" not in said and "running" not in said


async def test_server_error_then_success_via_retries(connect: Connect) -> None:
    server, provider = connect([ServerReply(status=500), ServerReply(text="ok")])
    sleeps = Sleeps()
    retries: list[float] = []

    reply: Reply = await call_with_retries(
        lambda: provider.chat(request()),
        RetryPolicy(),
        sleep=sleeps,
        on_retry=lambda _e, wait: retries.append(wait),
    )

    assert reply.text == "ok"
    assert len(server.requests) == 2  # the SDK itself did not retry
    assert len(sleeps.delays) == 1 and 0.25 <= sleeps.delays[0] <= 0.5
    assert retries == sleeps.delays


async def test_retries_give_up_after_the_policy_attempts(connect: Connect) -> None:
    server, provider = connect([ServerReply(status=503)] * 5)
    with pytest.raises(TransientProviderError):
        await call_with_retries(
            lambda: provider.chat(request()), RetryPolicy(attempts=3), sleep=Sleeps()
        )
    assert len(server.requests) == 3


async def test_unauthorized_is_auth_error_with_a_fix(connect: Connect) -> None:
    _, provider = connect([ServerReply(status=401)])
    with pytest.raises(AuthError) as caught:
        await provider.chat(request())
    assert caught.value.status == 401
    assert "ANTHROPIC_API_KEY" in str(caught.value)
    assert "config.toml" in str(caught.value)


async def test_unknown_model_names_heron_models(connect: Connect) -> None:
    body = {"type": "error", "error": {"type": "not_found_error", "message": f"model: {MODEL}"}}
    _, provider = connect([ServerReply(status=404, error_body=body)])
    with pytest.raises(UnknownModel) as caught:
        await provider.chat(request())
    assert "heron models" in str(caught.value)
    assert caught.value.status == 404


async def test_prompt_too_long_is_context_overflow(connect: Connect) -> None:
    message = "prompt is too long: 215000 tokens > 200000 maximum"
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    _, provider = connect([ServerReply(status=400, error_body=body)])
    with pytest.raises(ContextOverflow) as caught:
        await provider.chat(request())
    assert "215000" in str(caught.value)


async def test_other_bad_request_is_fatal(connect: Connect) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad tool"}}
    _, provider = connect([ServerReply(status=400, error_body=body)])
    with pytest.raises(FatalProviderError, match="bad tool"):
        await provider.chat(request())


async def test_exhausted_script_answers_500_saying_so(connect: Connect) -> None:
    _, provider = connect([])
    with pytest.raises(TransientProviderError, match="script exhausted"):
        await provider.chat(request())


# ---- fake server and import cost ---------------------------------------------------------------


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url + "/v1/messages", data, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_fake_server_answers_non_streamed_json_from_a_callable_script() -> None:
    def script(body: dict[str, Any]) -> ServerReply:
        return ServerReply(text=f"echo {body['messages'][0]['content']}")

    with FakeAnthropicServer(script) as server:
        status, message = _post(
            server.base_url,
            {"model": MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "yo"}]},
        )
    assert status == 200
    assert message["content"] == [{"type": "text", "text": "echo yo"}]
    assert message["stop_reason"] == "end_turn"
    assert server.requests[0]["max_tokens"] == 9


def test_fake_server_rejects_empty_text_like_the_real_api() -> None:
    bad = {
        "model": MODEL,
        "max_tokens": 9,
        "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}],
    }
    with FakeAnthropicServer([ServerReply(text="never")]) as server:
        status, error = _post(server.base_url, bad)
    assert status == 400
    assert error["error"]["type"] == "invalid_request_error"


def test_importing_the_adapter_does_not_import_the_sdk() -> None:
    code = "import sys, heron.providers.anthropic; print('anthropic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_the_fake_can_report_usage_from_the_block_level_cache() -> None:
    server = FakeAnthropicServer(
        [ServerReply(text="one"), ServerReply(text="two")], block_cache=True
    )
    provider = AnthropicProvider(MODEL, KEY, base_url=server.start(), timeout=10)
    try:
        first = await provider.chat(request(user("x" * 400)))
        second = await provider.chat(request(user("x" * 400), assistant("one"), user("more")))
    finally:
        await provider.aclose()
        server.stop()

    one, two = server.cache_uses
    assert (first.usage.cache_read, first.usage.cache_write) == (0, one.written)
    assert second.usage.cache_read == two.read == one.written  # the whole first request
    assert second.usage.input == two.read + two.written + two.uncached
