"""The Anthropic Messages API adapter, on the official SDK.

The SDK is imported lazily (in the constructor) so that importing this module stays cheap: CLI
start-up time is measured and most commands never talk to a model. The SDK's own retries are
off (`max_retries=0`); the runner retries around `chat()` with `call_with_retries`
(heron/providers/base.py), so a failed call surfaces as exactly one `heron.errors` type.

`Thinking.provider_state` for this provider is a JSON string, either
`{"type": "thinking", "signature": "..."}` or `{"type": "redacted_thinking", "data": "..."}`,
and is replayed byte-exact: the API checks the signature against the thinking text.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from heron.errors import (
    AuthError,
    FatalProviderError,
    Overloaded,
    ProviderError,
    RateLimited,
    TransientProviderError,
    UnknownModel,
)
from heron.messages import (
    File,
    JSONObject,
    Message,
    Part,
    Reply,
    StopReason,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Usage,
    file_class,
)
from heron.providers.base import (
    OutputMeter,
    retry_after,
    stalled,
    within_stall,
)
from heron.providers.endpoint import (
    Endpoint,
    connection_error,
    cut_mid_reply,
    is_a_stream,
    model_ids,
    no_api_there,
    rate_limited_hint,
    server_failed_hint,
)
from heron.providers.overflow import is_overflow, overflow_error
from heron.providers.profiles import ModelProfile, profile_for
from heron.providers.wire import ToolsMemo, body_of, file_note, takes_file
from heron.request import ChatRequest, OnEvent, StreamEvent, ToolSpec

PROVIDER = "anthropic"
AUTH_HINT = (
    "Set ANTHROPIC_API_KEY (or api_key under [providers.anthropic] in config.toml) to a valid key."
)
MODEL_HINT = "Run `heron models` to list the models this provider serves."
OVERLOADED_HINT = "Anthropic's service is overloaded; try again in a few minutes."
_CACHE = {"type": "ephemeral"}
_STOP: dict[str, StopReason] = {
    "tool_use": "tool",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}


class AnthropicProvider:
    name = PROVIDER

    def __init__(
        self,
        model: str,
        api_key: str,
        base_url: str | None = None,
        timeout: float = 600,
        profile: ModelProfile | None = None,
        url_source: str | None = None,
    ) -> None:
        import anthropic  # lazy: see the module docstring

        self.model = model
        self.profile = profile or profile_for(model)
        self._tools = ToolsMemo()
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
        )
        # Errors about the server name its URL and this setting (heron/providers/endpoint.py).
        self.endpoint = Endpoint.of(self._client.base_url, url_source)

    def payload(self, request: ChatRequest) -> JSONObject:
        return build_payload(request, self._tools, self.profile)

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        """One streamed call. Does not retry: the caller wraps it with `call_with_retries`."""
        body = body_of(self, request).value
        stall = request.stall_timeout
        with map_errors(self.endpoint, self.model):
            try:
                async with asyncio.timeout(stall):  # a server that accepts and never answers
                    stream = await _post_stream(self._client, body)
            except TimeoutError as error:
                raise stalled(stall, self.endpoint) from error
        assembler = _Assembler(on_event, OutputMeter(request.max_tokens))
        try:
            content_type = stream.response.headers.get("content-type", "")
            is_a_stream(content_type, self.endpoint, "/v1/messages", _anthropic_api(self.endpoint))
            async for event in within_stall(_events(stream, self.endpoint), stall, self.endpoint):
                assembler.feed(event)
                if assembler.cut:
                    break  # past the output cap: the rest is left unread
        finally:
            await stream.close()
        return assembler.reply()

    async def list_models(self, timeout: float) -> list[str]:
        """The ids GET /v1/models lists (`heron models`, its first page), failures mapped as a
        chat's are; at most `timeout` seconds, no retry."""
        models = self._client.with_options(timeout=timeout).models
        with map_errors(self.endpoint):
            raw = await models.with_raw_response.list(limit=1000)
            text = await raw.text()
        content_type = raw.headers.get("content-type", "")
        return model_ids(text, content_type, self.endpoint, _anthropic_api(self.endpoint))

    async def aclose(self) -> None:
        await self._client.close()


async def _post_stream(client: Any, body: JSONObject) -> Any:
    """POST through the SDK (auth, headers, SSE decoding, error types) without
    `messages.create`'s recursive type transform of the body, which is already wire JSON and
    costs seconds for a long history."""
    from anthropic import AsyncStream
    from anthropic.types import Message, RawMessageStreamEvent

    return await client.post(
        "/v1/messages",
        body=body,
        cast_to=Message,
        stream=True,
        stream_cls=AsyncStream[RawMessageStreamEvent],
    )


# ---- request -----------------------------------------------------------------------------------


def build_payload(
    request: ChatRequest, tools: ToolsMemo | None = None, profile: ModelProfile | None = None
) -> JSONObject:
    """The exact Messages API body for `request`, with its cache breakpoints (`_breakpoints`).
    Images and PDFs go as `image` and `document` blocks when the profile says the model takes
    them (the default for a claude-* name), else as a short note."""
    body: JSONObject = {"model": request.model, "max_tokens": request.max_tokens}
    if request.system:
        body["system"] = [{"type": "text", "text": request.system, "cache_control": _CACHE}]
    body["messages"] = _wire_messages(request.messages, profile or profile_for(request.model))
    if request.tools:
        last = request.tools[-1]
        build = functools.partial(_wire_tool, last=last)
        body["tools"] = (tools or ToolsMemo()).get(request.tools, build)
    body["stream"] = True
    return body


# Where the cache breakpoints go (at most 4; Anthropic refuses a fifth). The cache is looked up
# at each breakpoint, and from each one at most about 20 blocks back (Anthropic's prompt-caching
# docs), in the order tools, system, messages. So:
#   1. the last tool: a new system prompt (a consolidation) still reads the tool schemas;
#   2. the system prompt: a changed early message (ten results made placeholders) still reads
#      tools and system;
#   3. the block the previous request ended with, the one before the last assistant message:
#      that is where the previous request wrote its entry, so it is read whatever the number of
#      blocks since (a reply with 12 parallel calls adds 24, past the lookback of the last one);
#   4. the end of the conversation, where this request writes the entry the next one reads.


def _wire_tool(spec: ToolSpec, last: ToolSpec | None = None) -> JSONObject:
    tool: JSONObject = {
        "name": spec.name,
        "description": spec.description,
        "input_schema": spec.parameters,
    }
    if spec is last:
        tool["cache_control"] = _CACHE
    return tool


def _markable(content: list[JSONObject]) -> JSONObject | None:
    # Thinking blocks cannot carry cache_control; the breakpoint goes on the last one that can.
    for block in reversed(content):
        if block["type"] not in ("thinking", "redacted_thinking"):
            return block
    return None


def _previous_end(messages: list[Message]) -> int | None:
    """The index of the message the previous request of this conversation ended with: every
    request after the first follows a reply, so it is the one before the last assistant
    message (None when there is no such message)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            before = i - 1
            while before >= 0 and messages[before].role == "assistant":
                before -= 1
            return before if before >= 0 else None
    return None


def _wire_messages(messages: list[Message], profile: ModelProfile) -> list[JSONObject]:
    """Messages as wire dicts, with breakpoints 3 and 4. Empty messages are dropped and
    same-role neighbours merged, because the API rejects empty content (and a dropped message
    would break alternation)."""
    merged: list[tuple[str, list[JSONObject]]] = []
    resumed: JSONObject | None = None
    previous_end = _previous_end(messages)
    for i, message in enumerate(messages):
        content = _wire_content(message.parts, profile)
        if content:
            if merged and merged[-1][0] == message.role:
                merged[-1][1].extend(content)
            else:
                merged.append((message.role, content))
        if i == previous_end and merged:
            resumed = _markable(merged[-1][1])
    ordered = [(role, _order(content)) for role, content in merged]
    marked = [resumed, _markable(ordered[-1][1]) if ordered else None]
    for block in marked:
        if block is not None:
            block["cache_control"] = _CACHE
    return [{"role": role, "content": content} for role, content in ordered]


def _order(content: list[JSONObject]) -> list[JSONObject]:
    # The API wants tool_result blocks first in a user message; the sort is stable otherwise.
    return sorted(content, key=lambda block: block["type"] != "tool_result")


# Neighbouring text parts of one message (the user's words, the runtime block, a checkpoint)
# are joined with a blank line, as the OpenAI-compatible adapter joins them: the model reads the
# same words on either wire, and one block, not several, counts against the cache's lookback.
TEXT_JOIN = "\n\n"


def _wire_content(parts: tuple[Part, ...], profile: ModelProfile) -> list[JSONObject]:
    blocks: list[JSONObject] = []
    for part in parts:
        block = _wire_file(part, profile) if isinstance(part, File) else _wire_block(part)
        if block is None or (block["type"] == "text" and not _text(block).strip()):
            continue  # whitespace-only text is rejected as empty by the API
        if block["type"] == "text" and blocks and blocks[-1]["type"] == "text":
            joined = _text(blocks[-1]) + TEXT_JOIN + _text(block)
            blocks[-1] = {"type": "text", "text": joined}
        else:
            blocks.append(block)
    return blocks


def _text(block: JSONObject) -> str:
    """A text block's text (built here, so always a string)."""
    text = block.get("text")
    return text if isinstance(text, str) else ""


def _wire_block(part: Part) -> JSONObject | None:
    if isinstance(part, Text):
        return {"type": "text", "text": part.text} if part.text else None
    if isinstance(part, ToolCall):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": part.args}
    if isinstance(part, ToolResult):
        return {
            "type": "tool_result",
            "tool_use_id": part.call_id,
            "content": part.content,
            "is_error": part.is_error,
        }
    if isinstance(part, Thinking):
        return _wire_thinking(part)
    raise TypeError(f"not a message part: {part!r}")


def _wire_thinking(part: Thinking) -> JSONObject | None:
    """Anthropic's own thinking goes back byte-exact; anyone else's is dropped, since the API
    would reject a block it did not sign."""
    if part.provider != PROVIDER or not part.provider_state:
        return None
    try:
        state = json.loads(part.provider_state)
    except ValueError:
        return None
    if state.get("type") == "redacted_thinking" and state.get("data"):
        return {"type": "redacted_thinking", "data": state["data"]}
    if state.get("type") == "thinking" and state.get("signature"):
        return {"type": "thinking", "thinking": part.text or "", "signature": state["signature"]}
    return None


def _wire_file(part: File, profile: ModelProfile) -> JSONObject:
    """An image block, a document block (a PDF as base64, a text file as text), or the note a
    model gets for a file it does not take."""
    if part.data is None or not takes_file(part, vision=profile.vision, pdf=profile.pdf):
        return {"type": "text", "text": file_note(part)}
    kind = file_class(part)
    if kind == "image":
        data = base64.b64encode(part.data).decode("ascii")
        source = {"type": "base64", "media_type": part.media_type, "data": data}
        return {"type": "image", "source": source}
    if kind == "text":
        text = part.data.decode("utf-8", errors="replace")
        source = {"type": "text", "media_type": "text/plain", "data": text}
    else:
        data = base64.b64encode(part.data).decode("ascii")
        source = {"type": "base64", "media_type": part.media_type, "data": data}
    block: JSONObject = {"type": "document", "source": source}
    if part.name:
        block["title"] = part.name
    return block


def thinking_state(signature: str | None = None, redacted_data: str | None = None) -> str:
    """The `provider_state` this adapter stores for a thinking block."""
    if redacted_data is not None:
        return json.dumps({"type": "redacted_thinking", "data": redacted_data})
    return json.dumps({"type": "thinking", "signature": signature or ""})


# ---- response ----------------------------------------------------------------------------------


@dataclass
class _Block:
    type: str
    text: str = ""
    signature: str = ""
    data: str = ""
    id: str = ""
    name: str = ""
    json: str = ""
    input: JSONObject = field(default_factory=dict)


class _Assembler:
    """Folds raw stream events into a Reply, forwarding text and thinking deltas as they come.
    Past the meter's cap it is `cut`: the caller stops reading and the reply ends "length"."""

    def __init__(self, on_event: OnEvent | None, meter: OutputMeter | None = None) -> None:
        self.on_event = on_event
        self.meter = meter or OutputMeter(4096)
        self.blocks: dict[int, _Block] = {}
        self.usage: dict[str, int] = {}
        self.stop_reason: str | None = None
        self.finished = False
        self.cut = False

    def feed(self, event: Any) -> None:
        kind = event.type
        if kind == "message_start":
            self._usage(event.message.usage)
            self._emit_usage()
        elif kind == "content_block_start":
            self.blocks[event.index] = _start_block(event.content_block)
        elif kind == "content_block_delta":
            self._delta(self.blocks[event.index], event.delta)
            if self.meter.over and not self.finished:
                self._cut_off()
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            self._usage(event.usage)
            self._emit_usage()
        elif kind == "message_stop":
            self.finished = True

    def _usage(self, usage: Any) -> None:
        # message_delta repeats some counts cumulatively; the latest non-null value wins.
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens"):
            if getattr(usage, key, None) is not None:  # probe: SDK usage fields
                self.usage[key] = getattr(usage, key)  # probe: SDK usage fields
        if getattr(usage, "cache_creation_input_tokens", None) is not None:  # probe: SDK usage
            self.usage["cache_creation_input_tokens"] = usage.cache_creation_input_tokens

    def _delta(self, block: _Block, delta: Any) -> None:
        if delta.type == "text_delta":
            block.text += delta.text
            self.meter.add(delta.text)
            self._emit(StreamEvent("text", delta.text))
        elif delta.type == "thinking_delta":
            block.text += delta.thinking
            self.meter.add(delta.thinking)
            self._emit(StreamEvent("thinking", delta.thinking))
        elif delta.type == "signature_delta":
            block.signature += delta.signature
        elif delta.type == "input_json_delta":
            block.json += delta.partial_json
            self.meter.add(delta.partial_json)

    def _emit_usage(self) -> None:
        """The counts so far, for a call stopped before message_stop (its usage is kept)."""
        if self.on_event is not None:
            self.on_event(StreamEvent("usage", "", self._total_usage()))

    def _emit(self, event: StreamEvent) -> None:
        if self.on_event is not None and event.text:
            self.on_event(event)

    def _cut_off(self) -> None:
        """The reply passed its output cap: keep its text and reasoning, drop the tool calls
        (the last one's input is unfinished), and count the output the server did not."""
        self.cut = self.finished = True
        self.stop_reason = "max_tokens"
        self.blocks = {i: b for i, b in self.blocks.items() if b.type != "tool_use"}
        self.usage["output_tokens"] = self.meter.tokens

    def reply(self) -> Reply:
        if not self.finished:
            raise TransientProviderError("the response stream ended before message_stop")
        parts = [_part(self.blocks[i]) for i in sorted(self.blocks)]
        stop = _STOP.get(self.stop_reason or "", "done")
        return Reply([p for p in parts if p is not None], stop, self._total_usage())

    def _total_usage(self) -> Usage:
        read = self.usage.get("cache_read_input_tokens", 0)
        write = self.usage.get("cache_creation_input_tokens", 0)
        return Usage(
            input=self.usage.get("input_tokens", 0) + read + write,
            output=self.usage.get("output_tokens", 0),
            cache_read=read,
            cache_write=write,
        )


def _start_block(block: Any) -> _Block:
    return _Block(
        type=block.type,
        text=getattr(block, "text", None)  # probe: SDK content block
        or getattr(block, "thinking", None)  # probe: SDK content block
        or "",
        signature=getattr(block, "signature", None) or "",  # probe: SDK content block
        data=getattr(block, "data", None) or "",  # probe: SDK content block
        id=getattr(block, "id", None) or "",  # probe: SDK content block
        name=getattr(block, "name", None) or "",  # probe: SDK content block
        input=dict(getattr(block, "input", None) or {}),  # probe: SDK content block
    )


def _part(block: _Block) -> Part | None:
    if block.type == "text":
        return Text(block.text) if block.text else None
    if block.type == "thinking":
        return Thinking(block.text, thinking_state(block.signature), PROVIDER)
    if block.type == "redacted_thinking":
        return Thinking(None, thinking_state(redacted_data=block.data), PROVIDER)
    if block.type == "tool_use":
        return ToolCall(block.id, block.name, _tool_input(block))
    return None  # server tools, citations and future block types: not part of Heron's model


def _tool_input(block: _Block) -> JSONObject:
    if not block.json:
        return block.input
    try:
        args = json.loads(block.json)
    except ValueError as error:
        raise TransientProviderError(
            f"tool call {block.name!r} arrived with malformed JSON input", body=block.json
        ) from error
    if not isinstance(args, dict):
        raise TransientProviderError(f"tool call {block.name!r} input is not an object")
    return args


# ---- errors ------------------------------------------------------------------------------------


async def _events(stream: Any, endpoint: Endpoint) -> AsyncIterator[Any]:
    """The stream's events, with SDK and transport errors mapped: the server has answered, so
    a broken connection now is a reply cut midway. Only the SDK's own work runs under
    `map_errors`, so a bug in the assembler is never mistaken for a provider failure."""
    iterator = stream.__aiter__()
    while True:
        with map_errors(endpoint, answered=True):
            try:
                event = await iterator.__anext__()
            except StopAsyncIteration:
                return
        yield event


@contextmanager
def map_errors(endpoint: Endpoint, model: str = "", *, answered: bool = False) -> Iterator[None]:
    """Turn whatever the SDK or the transport raises into one `heron.errors` type (`model`:
    the name an overflow's hint gives the setting of; `answered`: the reply had begun)."""
    try:
        yield
    except ProviderError:
        raise
    except Exception as error:
        mapped = to_provider_error(error, endpoint, model, answered=answered)
        if mapped is None:
            raise
        raise mapped from error


def to_provider_error(
    error: Exception, endpoint: Endpoint, model: str = "", *, answered: bool = False
) -> ProviderError | None:
    """The Heron error for an SDK/transport exception, or None when it is not one (a bug).
    `answered`: the server had started its reply, so a broken connection is a stream cut
    mid-reply (as the OpenAI adapter says it), not a server that cannot be reached."""
    import anthropic  # already loaded by the time any call can fail

    if isinstance(error, anthropic.APIStatusError):
        return _status_error(error, endpoint, model)
    if isinstance(error, anthropic.APITimeoutError):
        return TransientProviderError(f"the request to {endpoint.named} timed out")
    if answered and isinstance(error, (anthropic.APIConnectionError, *_transport_errors())):
        return cut_mid_reply(error, endpoint)
    if isinstance(error, anthropic.APIConnectionError):
        return connection_error(error, endpoint)
    if isinstance(error, json.JSONDecodeError):
        return TransientProviderError(f"malformed event in the response stream: {error}")
    if isinstance(error, _transport_errors()):
        return TransientProviderError(f"the response stream broke off: {error!r}")
    return None


def _transport_errors() -> tuple[type[BaseException], ...]:
    # The SDK lets errors raised while reading a streamed body through unwrapped. Depending on
    # its version the HTTP client is httpx or httpx2; look up whichever it has already loaded.
    found = (
        getattr(sys.modules.get(m), "TransportError", None)  # probe: httpx module
        for m in ("httpx", "httpx2")
    )
    return tuple(cls for cls in found if isinstance(cls, type))


def _status_error(error: Any, endpoint: Endpoint, model: str = "") -> ProviderError:
    status: int = error.status_code
    body = error.body if isinstance(error.body, str) else json.dumps(error.body)
    kind = getattr(error, "type", None) or _error_field(error.body, "type")  # probe: SDK error
    message = (
        getattr(error, "api_message", None)  # probe: SDK error
        or _error_field(error.body, "message")
        or ""
    )
    if status in (405, 501) or (status == 404 and not _about_model(kind, message)):
        # No such route: the base URL is wrong (a /v1 too many), and no retry finds the API.
        url = error.request.url
        said = message or error.body
        return no_api_there(status, "POST", url, said, body, endpoint, _no_v1(endpoint))
    text = f"Anthropic API error {status} ({kind or 'unknown'})" + (
        f": {message}" if message else ""
    )
    if is_overflow(status, f"{kind} {message}"):
        return overflow_error(text, model, message, status, body)
    cls = _classify(status, kind, message)
    hint = {AuthError: AUTH_HINT, UnknownModel: MODEL_HINT, Overloaded: OVERLOADED_HINT}.get(cls)
    if cls is RateLimited:
        hint = rate_limited_hint(endpoint)
    elif cls is TransientProviderError and status >= 500:
        hint = server_failed_hint(status, endpoint)
    return cls(
        text, status=status, body=body, retry_after=retry_after(error.response.headers), hint=hint
    )


def _classify(status: int, kind: str | None, message: str) -> type[ProviderError]:
    if status in (401, 403) or kind in ("authentication_error", "permission_error"):
        return AuthError
    if status == 529 or kind == "overloaded_error":
        return Overloaded
    if status == 429 or kind == "rate_limit_error":
        return RateLimited
    if status == 404 and _about_model(kind, message):
        return UnknownModel
    # 408 is a timeout, and an `api_error` event can arrive mid-stream under a 200 status.
    if status >= 500 or status == 408 or kind in ("api_error", "timeout_error"):
        return TransientProviderError
    return FatalProviderError


def _no_v1(endpoint: Endpoint) -> str:
    """The Anthropic wire's advice: its base URL is the host, the SDK adds /v1/messages."""
    setting = endpoint.source or "the base URL"
    if endpoint.url.endswith("/v1"):
        root = endpoint.url.removesuffix("/v1")
        return f"Anthropic's base URL ends before /v1 (the SDK adds it): try {root} in {setting}."
    return f"Check {setting}: Anthropic's base URL is the address /v1/messages is under."


def _anthropic_api(endpoint: Endpoint) -> str:
    """What to check when the base URL answers with something that is not this API."""
    return f"is this Anthropic's Messages API? {_no_v1(endpoint)}"


def _about_model(kind: str | None, message: str) -> bool:
    return kind in (None, "not_found_error") and "model" in message.lower()


def _error_field(body: object, key: str) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        value = body["error"].get(key)
        return value if isinstance(value, str) else None
    return None
