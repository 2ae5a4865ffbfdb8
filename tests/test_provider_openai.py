from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from heron.errors import (
    AuthError,
    ContextOverflow,
    ProviderError,
    RateLimited,
    ToolError,
    TransientProviderError,
    UnknownModel,
)
from heron.messages import File, Message, Text, Thinking, ToolCall, ToolResult, user
from heron.providers.base import RetryPolicy, call_with_retries
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.profiles import ModelProfile
from heron.request import ChatRequest, StreamEvent, ToolSpec
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool

READ = ToolSpec(
    "read_file",
    "Read a file.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[FakeOpenAIServer] = []

    def start(script: Any, **kw: Any) -> tuple[FakeOpenAIServer, OpenAICompatProvider]:
        server = FakeOpenAIServer(script)
        servers.append(server)
        url = server.start()
        return server, OpenAICompatProvider("fake-model", "sk-test", base_url=url, **kw)

    yield start
    for server in servers:
        server.stop()


def request(*messages: Message, tools: list[ToolSpec] | None = None) -> ChatRequest:
    return ChatRequest(
        "fake-model", "You are terse.", list(messages) or [user("hi")], tools or [], 64
    )


async def test_stream_text_and_usage(serve: Any) -> None:
    reply_spec = ServerReply(text="Hello there, general Kenobi!", chunk_size=5, cached_tokens=7)
    server, provider = serve([reply_spec])
    events: list[StreamEvent] = []
    reply = await provider.chat(request(), events.append)
    await provider.aclose()

    assert reply.text == "Hello there, general Kenobi!"
    assert reply.stop == "done"
    # The usage comes last, as an event too (a call stopped before it keeps what came).
    assert [e.kind for e in events] == ["text"] * 6 + ["usage"]
    assert "".join(e.text for e in events) == reply.text
    assert events[-1].usage == reply.usage
    assert reply.usage.cache_read == 7
    assert reply.usage.input > 0 and reply.usage.output > 0
    assert server.headers[0]["authorization"] == "Bearer sk-test"
    sent = server.requests[0]
    assert sent["messages"][0] == {"role": "system", "content": "You are terse."}
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["max_tokens"] == 64 and "tools" not in sent


async def test_cached_tokens_estimated_from_previous_request(serve: Any) -> None:
    _, provider = serve([ServerReply(text="one"), ServerReply(text="two")])
    first = await provider.chat(request(user("a" * 400)))
    history = [user("a" * 400), first.message, user("more")]
    second = await provider.chat(request(*history))
    await provider.aclose()
    assert first.usage.cache_read == 0
    assert second.usage.cache_read >= 100


async def test_tool_call_argument_deltas_and_parallel_calls(serve: Any) -> None:
    calls = [
        ("call_a", "read_file", {"path": "notes/ä.txt", "nested": {"deep": [1, 2, 3]}}),
        ("call_b", "read_file", {"path": "b.txt"}),
    ]
    server, provider = serve([ServerReply(text="Reading.", tool_calls=calls, chunk_size=4)])
    reply = await provider.chat(request(tools=[READ]))
    await provider.aclose()

    assert reply.stop == "tool"
    assert reply.tool_calls == [ToolCall(c[0], c[1], c[2]) for c in calls]
    assert server.requests[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": READ.parameters,
            },
        }
    ]


async def test_invalid_tool_arguments_are_kept_raw(serve: Any) -> None:
    _, provider = serve([ServerReply(tool_calls=[("read_file", '{"path": "a.txt"')])])
    reply = await provider.chat(request(tools=[READ]))
    await provider.aclose()
    assert reply.tool_calls[0].args == {"_raw": '{"path": "a.txt"'}


async def test_length_stop(serve: Any) -> None:
    _, provider = serve([ServerReply(text="cut", stop="length")])
    reply = await provider.chat(request())
    await provider.aclose()
    assert reply.stop == "length"


@pytest.mark.parametrize("resend", [False, True])
async def test_reasoning_kept_and_resent_only_when_profile_says(serve: Any, resend: bool) -> None:
    script = [ServerReply(text="42", thinking="Let me think about it."), ServerReply(text="ok")]
    server, provider = serve(script, profile=ModelProfile(resend_reasoning=resend))
    events: list[StreamEvent] = []
    first = await provider.chat(request(), events.append)
    events = [e for e in events if e.kind != "usage"]
    assert first.parts[0] == Thinking(text="Let me think about it.", provider="openai")
    assert events[0].kind == "thinking" and events[-1] == StreamEvent("text", "42")

    await provider.chat(request(user("hi"), first.message, user("and?")))
    await provider.aclose()
    sent = server.requests[1]["messages"][2]
    assert sent["role"] == "assistant" and sent["content"] == "42"
    assert ("reasoning_content" in sent) is resend
    if resend:
        assert sent["reasoning_content"] == "Let me think about it."


def test_payload_is_deterministic_and_tool_results_are_tool_messages() -> None:
    provider = OpenAICompatProvider("m", "k", profile=ModelProfile())
    history = [
        user("read both"),
        Message(
            "assistant",
            [
                Thinking(text="from another provider", provider_state="sig", provider="anthropic"),
                ToolCall("c1", "read_file", {"path": "a", "b": [1, 2]}),
                ToolCall("c2", "read_file", {"path": "ü"}),
            ],
        ),
        Message(
            "user",
            [ToolResult("c1", "AAA"), ToolResult("c2", "no such file", is_error=True), Text("go")],
        ),
    ]
    req = request(*history, tools=[READ])
    first = json.dumps(provider.payload(req), ensure_ascii=False).encode()
    again = json.dumps(provider.payload(request(*history, tools=[READ])), ensure_ascii=False)
    assert first == again.encode()

    messages = provider.payload(req)["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assistant = messages[2]
    assert assistant["content"] is None and "reasoning_content" not in assistant
    assert assistant["tool_calls"][0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"b":[1,2],"path":"a"}'},
    }
    assert assistant["tool_calls"][1]["function"]["arguments"] == '{"path":"ü"}'
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "AAA"}
    assert messages[4]["content"] == "Error: no such file"
    assert messages[5] == {"role": "user", "content": "go"}


@tool
def guarded(ctx: ToolContext, command: str) -> str:
    """Refuse everything.

    Args:
        command: the command.
    """
    raise ToolError(f"refused: {command}")


async def test_a_tool_error_reaches_the_model_with_one_error_prefix(tmp_path) -> None:
    ctx = ToolContext(workspace=tmp_path)
    result = await ToolRegistry([guarded]).call(ToolCall("c1", "guarded", {"command": "ls"}), ctx)
    assert result.is_error and result.content == "Error: refused: ls"
    provider = OpenAICompatProvider("m", "k", profile=ModelProfile())
    history = [
        user("go"),
        Message("assistant", [ToolCall("c1", "guarded", {"command": "ls"})]),
        Message("user", [result]),
    ]
    sent = provider.payload(request(*history))["messages"][-1]
    assert sent == {"role": "tool", "tool_call_id": "c1", "content": "Error: refused: ls"}


def test_image_becomes_content_parts() -> None:
    provider = OpenAICompatProvider("gpt-4o", "k")  # its profile takes images
    msg = Message("user", [Text("what is this?"), File("image/png", b"\x89PNG")])
    content = provider.payload(request(msg))["messages"][1]["content"]
    assert content == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
    ]


async def test_stream_cut_midway_is_transient(serve: Any) -> None:
    _, provider = serve([ServerReply(text="a long reply " * 10, cut_after_events=3)])
    with pytest.raises(TransientProviderError):
        await provider.chat(request())
    await provider.aclose()


async def test_malformed_event_is_transient(serve: Any) -> None:
    _, provider = serve([ServerReply(text="hello", malformed_event=True)])
    with pytest.raises(TransientProviderError, match="malformed"):
        await provider.chat(request())
    await provider.aclose()


async def test_rate_limit_then_retry_succeeds(serve: Any) -> None:
    limited = ServerReply(status=429, headers={"retry-after": "1"})
    _, provider = serve([limited, limited, ServerReply(text="ok")])
    with pytest.raises(RateLimited) as caught:
        await provider.chat(request())
    assert caught.value.retry_after == 1.0 and caught.value.status == 429
    assert caught.value.__cause__ is not None
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    reply = await call_with_retries(
        lambda: provider.chat(request()), RetryPolicy(attempts=3), sleep=fake_sleep
    )
    await provider.aclose()
    assert reply.text == "ok" and slept == [1.0]


async def test_server_error_then_success(serve: Any) -> None:
    server, provider = serve([ServerReply(status=500), ServerReply(text="recovered")])
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    reply = await call_with_retries(
        lambda: provider.chat(request()), RetryPolicy(attempts=3), sleep=fake_sleep
    )
    await provider.aclose()
    assert reply.text == "recovered" and len(slept) == 1 and len(server.requests) == 2


async def test_500_maps_to_transient(serve: Any) -> None:
    _, provider = serve([ServerReply(status=503)])
    with pytest.raises(TransientProviderError) as caught:
        await provider.chat(request())
    await provider.aclose()
    assert caught.value.status == 503 and "fake error" in (caught.value.body or "")


async def test_401_is_auth_error_with_hint(serve: Any) -> None:
    _, provider = serve([ServerReply(status=401)])
    with pytest.raises(AuthError) as caught:
        await provider.chat(request())
    await provider.aclose()
    assert "OPENAI_API_KEY" in str(caught.value) and caught.value.status == 401


async def test_404_model_is_unknown_model(serve: Any) -> None:
    body = {"error": {"message": "The model `nope` does not exist", "type": "x", "code": None}}
    _, provider = serve([ServerReply(status=404, error_body=body)])
    with pytest.raises(UnknownModel) as caught:
        await provider.chat(request())
    await provider.aclose()
    assert "heron models" in str(caught.value) and "--model" in str(caught.value)


async def test_context_overflow(serve: Any) -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    _, provider = serve([ServerReply(status=400, error_body=body)])
    with pytest.raises(ContextOverflow) as caught:
        await provider.chat(request())
    await provider.aclose()
    assert caught.value.status == 400


async def test_connection_refused_is_transient() -> None:
    server = FakeOpenAIServer([])
    url = server.start()
    server.stop()
    provider = OpenAICompatProvider("fake-model", "k", base_url=url, timeout=5)
    with pytest.raises(TransientProviderError):
        await provider.chat(request())
    await provider.aclose()


async def test_exhausted_script_and_models_endpoint(serve: Any) -> None:
    _, provider = serve([])
    with pytest.raises(TransientProviderError, match="exhausted"):
        await provider.chat(request())
    models = await provider.client().models.list()
    await provider.aclose()
    assert [m.id for m in models.data] == ["fake-model"]


def test_callable_script_and_non_stream() -> None:
    import httpx

    def script(body: dict[str, Any]) -> ServerReply:
        return ServerReply(text=f"you said {body['messages'][-1]['content']}", tool_calls=[])

    with FakeOpenAIServer(script) as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": False}
        data = httpx.post(server.base_url + "/chat/completions", json=body).json()
    assert data["choices"][0]["message"]["content"] == "you said x"
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_import_does_not_load_the_sdk() -> None:
    import subprocess
    import sys

    code = "import sys, heron.providers.openai_compat; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_sdk_is_loaded_off_the_event_loop() -> None:
    """Its import (about a second on a busy machine) held a serve's loop, every conversation
    and the web UI with it, on the first model call after the serve started."""
    import subprocess
    import sys

    code = """
import asyncio, sys, threading
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "openai":
            print("on the loop's thread:", threading.current_thread() is threading.main_thread())
        return None
sys.meta_path.insert(0, Watch())
from heron.messages import user
from heron.providers.openai_compat import OpenAICompatProvider
from heron.request import ChatRequest
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
async def main():
    with FakeOpenAIServer([ServerReply(text="hello")]) as server:
        provider = OpenAICompatProvider("fake-model", "k", base_url=server.base_url)
        reply = await provider.chat(ChatRequest("fake-model", "", [user("hi")], [], 16))
        await provider.aclose()
    print(reply.text)
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["on the loop's thread: False", "hello"]


def clients_made(provider: OpenAICompatProvider) -> list[bool]:
    """Each client `provider` makes from now on, as whether it was made on the main thread."""
    made: list[bool] = []
    make = provider.client

    def client() -> Any:
        made.append(threading.current_thread() is threading.main_thread())
        return make()

    provider.client = client  # type: ignore[method-assign]
    return made


async def test_warming_makes_one_client_on_a_worker_thread(serve: Any) -> None:
    import asyncio

    from heron.providers import warm
    from heron.providers.fenced import FencedTools

    server, provider = serve([ServerReply(text="hi")])
    made = clients_made(provider)
    # The serve's warm-up (through the fenced-tools wrapper) and a first call at once.
    await asyncio.gather(warm(FencedTools(provider)), provider.chat(request()))
    await provider.aclose()
    assert made[0] is False and len(server.requests) == 1


# ---- what a final error says (qa20l L1-L3) ---------------------------------------------------


async def _failure(serve: Any, reply: ServerReply, key: str = "sk-test") -> ProviderError:
    server, _ = serve([reply])
    provider = OpenAICompatProvider(
        "fake-model", key, base_url=server.base_url, url_source="HERON_BASE_URL"
    )
    with pytest.raises(ProviderError) as caught:
        await provider.chat(request())
    await provider.aclose()
    return caught.value


async def test_a_server_error_names_the_server_its_setting_and_what_to_do(serve: Any) -> None:
    error = await _failure(serve, ServerReply(status=500))
    said = str(error)
    assert isinstance(error, TransientProviderError) and error.status == 500
    assert "(HERON_BASE_URL)" in said and "127.0.0.1" in said and "try again" in said


async def test_a_rate_limit_says_so_names_the_server_and_to_wait(serve: Any) -> None:
    error = await _failure(serve, ServerReply(status=429))
    said = str(error)
    assert isinstance(error, RateLimited) and "(HERON_BASE_URL)" in said
    assert "rate limit" in said and "wait" in said


async def test_a_refused_key_names_the_key_this_server_takes_not_openais(serve: Any) -> None:
    said = str(await _failure(serve, ServerReply(status=401)))
    assert "from HERON_API_KEY:" in said and "OPENAI_API_KEY" not in said and "refused" in said
    placeholder = str(await _failure(serve, ServerReply(status=401), key="not-needed"))
    assert "no key was set" in placeholder and "'not-needed'" in placeholder


async def test_a_stream_cut_mid_reply_is_not_called_cannot_connect(serve: Any) -> None:
    error = await _failure(serve, ServerReply(text="a long reply " * 10, cut_after_events=3))
    assert isinstance(error, TransientProviderError)
    assert "cannot connect" not in error.summary and "cut" in error.summary
    assert "(HERON_BASE_URL)" in error.summary
