"""The OpenAI chat-completions adapter: OpenAI itself, vLLM, llama.cpp server, anything compatible.

The `openai` SDK is imported lazily (it costs ~0.5 s at start-up, more on a busy machine), on a
worker thread the first time a call needs it (`warm`: a serve does it as it starts), never on the
event loop where it would hold every other conversation; it runs with `max_retries=0`:
Heron retries itself with `call_with_retries`, so every failure is mapped once, in `map_error`,
onto the heron.errors tree.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heron.errors import (
    AuthError,
    FatalProviderError,
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
    dumps,
    file_class,
)
from heron.providers.base import OutputMeter, retry_after, stalled, within_stall
from heron.providers.endpoint import (
    Endpoint,
    connection_error,
    cut_mid_reply,
    is_a_stream,
    model_ids,
    no_api_there,
    rate_limited_hint,
    server_failed_hint,
    with_v1,
)
from heron.providers.overflow import is_overflow, overflow_error
from heron.providers.profiles import PLACEHOLDER_KEY, ModelProfile, profile_for
from heron.providers.wire import ToolsMemo, body_of, file_note, takes_file
from heron.request import ChatRequest, OnEvent, StreamEvent, ToolSpec

if TYPE_CHECKING:
    from openai import AsyncOpenAI

PROVIDER = "openai"
OPENAI_KEY = "OPENAI_API_KEY (or api_key under [providers.openai] in config.toml)"
MODEL_HINT = (
    "Run `heron models` to list the models this server offers, then pick one with `--model` "
    "(or HERON_MODEL, or model in config.toml)."
)
# Where the SDK posts when no base URL is given (it then reads OPENAI_BASE_URL, which
# heron.config reads first and passes on as the base URL).
OPENAI_API = "https://api.openai.com/v1"


class OpenAICompatProvider:
    name = PROVIDER

    def __init__(
        self,
        model: str,
        api_key: str,
        base_url: str | None = None,
        profile: ModelProfile | None = None,
        timeout: float = 600,
        url_source: str | None = None,
    ) -> None:
        self.model = model
        self.api_key = api_key
        self.base_url = base_url
        self.url_source = url_source
        self.profile = profile or profile_for(model)
        self.timeout = timeout
        self._client: AsyncOpenAI | None = None
        self._warming: asyncio.Future[AsyncOpenAI] | None = None
        self._tools = ToolsMemo()

    # ---- request -----------------------------------------------------------------------------

    def payload(self, request: ChatRequest) -> JSONObject:
        body: JSONObject = {
            "model": request.model or self.model,
            "messages": self._messages(request),
        }
        if request.tools:
            body["tools"] = self._tools.get(request.tools, _tool)
        body["max_tokens"] = request.max_tokens
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return body

    def _messages(self, request: ChatRequest) -> list[JSONObject]:
        out: list[JSONObject] = []
        if request.system:
            out.append({"role": "system", "content": request.system})
        for message in request.messages:
            if message.role == "assistant":
                out.append(self._assistant(message))
            else:
                out.extend(_user(message, self.profile))
        return out

    def _assistant(self, message: Message) -> JSONObject:
        text = "".join(p.text for p in message.parts if isinstance(p, Text))
        calls = message.tool_calls
        wire: JSONObject = {"role": "assistant", "content": text if text or not calls else None}
        if self.profile.resend_reasoning:
            reasoning = "".join(
                p.text or ""
                for p in message.parts
                if isinstance(p, Thinking) and p.provider == PROVIDER
            )
            if reasoning:
                wire["reasoning_content"] = reasoning
        if calls:
            wire["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": dumps(c.args)},
                }
                for c in calls
            ]
        return wire

    @property
    def endpoint(self) -> Endpoint:
        """What errors about the server name: its URL (set late by a local server) and the
        setting that named it (heron/providers/endpoint.py)."""
        return Endpoint.of(self.base_url or OPENAI_API, self.url_source)

    # ---- call --------------------------------------------------------------------------------

    def client(self) -> AsyncOpenAI:
        if self._client is None:
            from openai import AsyncOpenAI  # lazy: keeps `import heron` fast

            self._client = AsyncOpenAI(
                api_key=self.api_key, base_url=self.base_url, max_retries=0, timeout=self.timeout
            )
        return self._client

    async def warm(self) -> None:
        """The SDK imported and the client made (its TLS context) on a worker thread: about a
        second, more on a busy machine, that the first call would spend holding the event loop.
        The client is bound to no loop until used."""
        if self._client is not None:
            return
        if self._warming is None or self._warming.done():  # one thread, however many callers
            self._warming = asyncio.ensure_future(asyncio.to_thread(self.client))
        with contextlib.suppress(Exception):  # one that cannot be made fails in `chat`, mapped
            await asyncio.shield(self._warming)

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        await self.warm()
        import openai  # loaded by `warm`

        body = body_of(self, request).value
        acc = _Accumulator(meter=OutputMeter(request.max_tokens))
        stall = request.stall_timeout
        answered = False  # the server answered: a broken connection now is a cut stream
        try:
            try:
                async with asyncio.timeout(stall):  # a server that accepts and never answers
                    stream = await _post_stream(self.client(), body)
            except TimeoutError as error:
                raise stalled(stall, self.endpoint) from error
            answered = True
            # `async with` releases the connection even when the caller cancels mid-stream,
            # and when a reply past its output cap is left unread.
            async with stream:
                content_type = stream.response.headers.get("content-type", "")
                path = "/chat/completions"
                is_a_stream(content_type, self.endpoint, path, _openai_api(self.endpoint))
                async for chunk in within_stall(stream, stall, self.endpoint):
                    for event in acc.add(chunk):
                        if on_event:
                            on_event(event)
                    if acc.cut:
                        break
        except (openai.OpenAIError, json.JSONDecodeError) as error:
            raise map_error(
                error, self.endpoint, key=self.key_words, answered=answered, model=self.model
            ) from error
        return acc.reply()

    @property
    def key_words(self) -> KeyWords:
        """The key this server is sent, as an error about it names it (never the key)."""
        return KeyWords(key_setting(self.endpoint.source), self.api_key == PLACEHOLDER_KEY)

    async def list_models(self, timeout: float) -> list[str]:
        """The ids the server's GET /models lists (`heron models`), failures mapped as a chat's
        are; at most `timeout` seconds, no retry."""
        await self.warm()
        import openai  # loaded by `warm`

        try:
            models = self.client().with_options(timeout=timeout).models
            raw = await models.with_raw_response.list()
        except openai.OpenAIError as error:
            raise map_error(error, self.endpoint, "GET", key=self.key_words) from error
        content_type = raw.headers.get("content-type", "")
        return model_ids(raw.text, content_type, self.endpoint, _openai_api(self.endpoint))

    async def aclose(self) -> None:
        if self._warming is not None:  # a client still being made is closed too
            await asyncio.gather(self._warming, return_exceptions=True)
            self._warming = None
        if self._client is not None:
            await self._client.close()
            self._client = None


# ---- wire helpers ----------------------------------------------------------------------------


def _openai_api(endpoint: Endpoint) -> str:
    """What to check when the base URL answers with something that is not this API."""
    return f"is this a model server's OpenAI-compatible API? {with_v1(endpoint)}"


async def _post_stream(client: AsyncOpenAI, body: JSONObject) -> Any:
    """POST the body through the SDK (auth, headers, SSE decoding, error types) without
    `chat.completions.create`'s recursive type transform: the body is already plain wire JSON,
    and transforming a 10,000-message history costs seconds."""
    from openai import AsyncStream
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    return await client.post(
        "/chat/completions",
        body=body,
        cast_to=ChatCompletion,
        stream=True,
        stream_cls=AsyncStream[ChatCompletionChunk],
    )


def _tool(spec: ToolSpec) -> JSONObject:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _user(message: Message, profile: ModelProfile) -> list[JSONObject]:
    """Tool results first, each its own role-"tool" message (they must directly follow the
    assistant's tool calls), then whatever the user said alongside them."""
    out: list[JSONObject] = [
        {"role": "tool", "tool_call_id": r.call_id, "content": _result_text(r)}
        for r in message.tool_results
    ]
    rest = [p for p in message.parts if isinstance(p, Text | File)]
    if not rest:
        return out
    if any(isinstance(p, File) for p in rest):
        out.append({"role": "user", "content": [_content_part(p, profile) for p in rest]})
    else:
        texts = [p.text for p in rest if isinstance(p, Text)]
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


ERROR_PREFIX = "Error: "


def _result_text(result: ToolResult) -> str:
    """The wire has no error flag for tool messages: the content says it, once. The tool
    registry already writes "Error: ..." into the results it makes (the text every channel
    and the other wires show), so only an error result that does not say so gets the prefix."""
    if not result.is_error or result.content.startswith(ERROR_PREFIX):
        return result.content
    return ERROR_PREFIX + result.content


def _content_part(part: Part, profile: ModelProfile) -> JSONObject:
    """A text part, an image as a data URL, a PDF as a `file` part (the chat-completions way
    of sending a document), a text file as text; a note for what the model does not take."""
    if isinstance(part, Text):
        return {"type": "text", "text": part.text}
    assert isinstance(part, File)
    if part.data is None or not takes_file(part, vision=profile.vision, pdf=profile.pdf):
        return {"type": "text", "text": file_note(part)}
    kind = file_class(part)
    if kind == "text":
        body = part.data.decode("utf-8", errors="replace")
        return {"type": "text", "text": f"[{part.name or 'file'}]\n{body}"}
    url = f"data:{part.media_type};base64,{base64.b64encode(part.data).decode('ascii')}"
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "file", "file": {"filename": part.name or "document.pdf", "file_data": url}}


# ---- stream assembly -------------------------------------------------------------------------


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class _Accumulator:
    """Folds chat.completion.chunk objects into a Reply; tool-call fragments join by index.
    Past the meter's cap it is `cut`: the caller stops reading and the reply ends "length"."""

    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: dict[int, _PendingCall] = field(default_factory=dict)
    finish: str | None = None
    usage: Usage = field(default_factory=Usage)
    meter: OutputMeter = field(default_factory=lambda: OutputMeter(4096))
    cut: bool = False
    counted: bool = False  # the server's usage arrived (the stream's last chunk)

    def add(self, chunk: Any) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if chunk.usage is not None:
            self.usage = _usage(chunk.usage)
            self.counted = True
            events.append(StreamEvent("usage", "", self.usage))
        for choice in chunk.choices or []:
            events.extend(self._delta(choice.delta))
            if choice.finish_reason:
                self.finish = choice.finish_reason
        if self.meter.over and self.finish is None:
            self._cut_off()
        return events

    def _cut_off(self) -> None:
        """The reply passed its output cap: keep its text, drop the tool calls still being
        written (their arguments are unfinished), and count the output the server did not."""
        self.cut = True
        self.finish = "length"
        self.calls.clear()
        self.usage = Usage(self.usage.input, self.meter.tokens, self.usage.cache_read)

    def _delta(self, delta: Any) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        extra = delta.model_extra or {}
        # Not in the SDK's schema: DeepSeek/llama.cpp say reasoning_content, vLLM says reasoning.
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.thinking.append(reasoning)
            self.meter.add(reasoning)
            events.append(StreamEvent("thinking", reasoning))
        if delta.content:
            self.text.append(delta.content)
            self.meter.add(delta.content)
            events.append(StreamEvent("text", delta.content))
        for tc in delta.tool_calls or []:
            call = self.calls.setdefault(tc.index, _PendingCall())
            call.id = call.id or (tc.id or "")
            if tc.function is not None:
                call.name += tc.function.name or ""
                call.arguments += tc.function.arguments or ""
                self.meter.add(tc.function.arguments or "")
        return events

    def reply(self) -> Reply:
        if self.finish is None:
            raise TransientProviderError("the stream ended before the model finished its reply")
        parts: list[Part] = []
        if self.thinking:
            parts.append(Thinking(text="".join(self.thinking), provider=PROVIDER))
        if self.text:
            parts.append(Text("".join(self.text)))
        calls = [self._call(i, c) for i, c in sorted(self.calls.items())]
        parts.extend(calls)
        usage = self.usage
        if not self.counted:
            # No closing usage (cut at the cap before it, or a server that sends none): the
            # call was billed but never counted; what was read of its output is the floor.
            usage = Usage(usage.input, max(usage.output, self.meter.tokens), usage.cache_read)
        stop = _stop(self.finish, bool(calls))
        return Reply(parts, stop, usage, usage_unknown=not self.counted)

    @staticmethod
    def _call(index: int, call: _PendingCall) -> ToolCall:
        try:
            args = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            # Keep what the model wrote; the runner reports the bad arguments back to it.
            args = {"_raw": call.arguments}
        return ToolCall(id=call.id or f"call_{index}", name=call.name, args=args)


def _stop(finish: str, has_calls: bool) -> StopReason:
    if finish == "tool_calls" or finish == "function_call" or has_calls:
        return "tool"
    return "length" if finish == "length" else "done"


def _usage(usage: Any) -> Usage:
    details = getattr(usage, "prompt_tokens_details", None)  # probe: SDK usage
    cached = getattr(details, "cached_tokens", None)  # probe: SDK usage (None when absent)
    return Usage(
        input=usage.prompt_tokens or 0,
        output=usage.completion_tokens or 0,
        cache_read=cached or 0,
    )


# ---- errors ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyWords:
    """The setting a server's key comes from, and whether none was set (a placeholder went)."""

    setting: str = OPENAI_KEY
    placeholder: bool = False

    def auth_hint(self, endpoint: Endpoint) -> str:
        if self.placeholder:
            return (
                f"{endpoint.named} wants a key and no key was set, so the placeholder "
                f"{PLACEHOLDER_KEY!r} was sent: set {self.setting} to this server's key."
            )
        return (
            f"{endpoint.named} refused the key sent, from {self.setting}: set it to a valid "
            "key for this server (local servers accept any)."
        )


def key_setting(url_source: str | None) -> str:
    """Where the key for the server a setting named comes from, as heron.config pairs them
    (`_openai_key`): OpenAI's own key only for OpenAI and OPENAI_BASE_URL's server."""
    if url_source is None or url_source == "OPENAI_BASE_URL":
        return OPENAI_KEY
    if url_source.endswith("config.toml"):
        return "api_key under [providers.openai] in config.toml (or HERON_API_KEY)"
    return "HERON_API_KEY"  # HERON_BASE_URL's server takes only it


def map_error(
    error: Exception,
    endpoint: Endpoint | None = None,
    method: str = "POST",
    *,
    key: KeyWords = KeyWords(),
    answered: bool = False,
    model: str = "",
) -> ProviderError:
    """The one place SDK and stream failures become Heron errors; those about the server
    itself name `endpoint` (heron/providers/endpoint.py), a refused key the setting it came
    from (`key`). `answered`: the server had started its reply, so a broken connection is a
    stream cut mid-reply, not a server that cannot be reached. `model`: the name an overflow's
    hint gives the setting of."""
    import openai

    endpoint = endpoint or Endpoint(OPENAI_API)
    if isinstance(error, json.JSONDecodeError):
        return TransientProviderError(f"malformed event in the stream: {error}")
    if isinstance(error, openai.APIStatusError):
        return _status_error(error, endpoint, method, key, model)
    if isinstance(error, openai.APITimeoutError):
        return TransientProviderError(f"the request to {endpoint.named} timed out")
    if isinstance(error, openai.APIConnectionError) and answered:
        return cut_mid_reply(error, endpoint)
    if isinstance(error, openai.APIConnectionError):
        return connection_error(error, endpoint)
    if isinstance(error, openai.APIError):
        # An error object sent inside the stream: the server gave up mid-reply.
        return TransientProviderError(f"the server reported an error mid-stream: {error.message}")
    return FatalProviderError(f"unexpected client error: {error}")


def _status_error(
    error: Any, endpoint: Endpoint, method: str, key: KeyWords, model: str
) -> ProviderError:
    status: int = error.status_code
    body = error.body if isinstance(error.body, str) else json.dumps(error.body, default=str)
    message = f"HTTP {status} from {endpoint.named}: {_message(error)}"
    code = str(error.code or "")
    if status == 429:
        wait, hint = retry_after(error.response.headers), rate_limited_hint(endpoint)
        return RateLimited(message, retry_after=wait, status=status, body=body, hint=hint)
    if status in (405, 501) or (status == 404 and not _about_model(code, body)):
        # No such route, or a server that takes no POST there (python -m http.server): the
        # base URL is wrong, and no retry will find the API.
        said = _message(error) if isinstance(error.body, dict) else error.body
        return no_api_there(
            status, method, error.request.url, said, body, endpoint, with_v1(endpoint)
        )
    text = f"{code} {body} {error.message}"
    if is_overflow(status, text):
        return overflow_error(message, model, text, status, body)
    if status >= 500:
        hint = server_failed_hint(status, endpoint)
        return TransientProviderError(message, status=status, body=body, hint=hint)
    if status in (401, 403):
        return AuthError(message, hint=key.auth_hint(endpoint), status=status, body=body)
    if status == 404 or code == "model_not_found":
        return UnknownModel(message, hint=MODEL_HINT, status=status, body=body)
    return FatalProviderError(message, status=status, body=body)


def _about_model(code: str, body: str | None) -> bool:
    """A 404 that is about the model (OpenAI's model_not_found, vLLM's and ollama's "model ...
    not found"), not about the path."""
    return code == "model_not_found" or "model" in (body or "").lower()


def _message(error: Any) -> str:
    if isinstance(error.body, dict) and isinstance(error.body.get("message"), str):
        return str(error.body["message"])
    return str(error.message)
