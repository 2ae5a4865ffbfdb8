"""A fake Anthropic Messages API on 127.0.0.1, for tests and benchmarks.

It speaks the real wire (`POST /v1/messages`, JSON errors, Server-Sent Events with chunked
transfer encoding) so the official SDK can talk to it unmodified, and it answers from a
`Script`. Token counts follow Heron's convention: a `ServerReply.input_tokens` is the whole
prompt; on the wire it is split into `input_tokens` (uncached), `cache_read_input_tokens` and
`cache_creation_input_tokens`, as the real API does.

    with FakeAnthropicServer([ServerReply(text="hi")]) as server:
        provider = AnthropicProvider("claude-x", "key", base_url=server.base_url)
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from heron.testing.anthropic_cache import BlockCache, CacheUse
from heron.testing.script import (
    ENDLESS_ARGS,
    ENDLESS_TEXT,
    Script,
    ServerReply,
    common_prefix,
    go_on,
)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_MAX_CACHE_BREAKPOINTS = 4


class FakeAnthropicServer:
    """A threaded HTTP server answering Messages API requests from `script`, in order."""

    def __init__(
        self, script: Script, models: list[str] | None = None, block_cache: bool = False
    ) -> None:
        self.script = script
        # block_cache: usage from the block-level model of the prompt cache (breakpoints, the
        # 20-block lookback: heron/testing/anthropic_cache.py) instead of the byte prefix
        # shared with the previous request; `cache_uses` keeps each request's.
        self.block_cache = BlockCache() if block_cache else None
        self.cache_uses: list[CacheUse] = []
        self.models = models or ["claude-fake-1"]  # what GET /v1/models lists
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self.stopping = threading.Event()  # ends hanging, stalled and endless replies
        self._served = 0
        self._previous_body = ""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> str:
        self.stopping.clear()
        handler = type("_BoundHandler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True  # a stuck delay_s reply must not block shutdown
        # A short poll interval so stop() (which waits for the loop to notice) is quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.base_url

    def stop(self) -> None:
        if self._server is None:
            return
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeAnthropicServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- request handling (called from handler threads) --------------------------------------

    def _record(self, raw: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, int]:
        """Record a request; return (index of this request, estimated cached tokens)."""
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            cached = common_prefix(self._previous_body, raw) // 4
            self._previous_body = raw
            return len(self.requests) - 1, cached

    def _use_cache(self, body: dict[str, Any]) -> CacheUse:
        assert self.block_cache is not None
        with self._lock:
            use = self.block_cache.use(body)
            self.cache_uses.append(use)
            return use

    def _next_reply(self, body: dict[str, Any]) -> ServerReply | str:
        """The scripted reply, or an error message when the script has none left."""
        if callable(self.script):
            return self.script(body)
        with self._lock:
            if self._served >= len(self.script):
                return f"FakeAnthropicServer: script exhausted after {len(self.script)} replies"
            reply = self.script[self._served]
            self._served += 1
            return reply


class _Handler(BaseHTTPRequestHandler):
    fake: FakeAnthropicServer
    protocol_version = "HTTP/1.1"  # chunked SSE, so a cut stream is visible to the client

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/v1/models":
            self._send_error(404, "not_found_error", f"no route {self.path}")
            return
        data = [
            {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
            for m in self.fake.models
        ]
        ends = {"first_id": data[0]["id"], "last_id": data[-1]["id"]} if data else {}
        self._send_json(200, {"data": data, "has_more": False, **ends}, {})

    def do_POST(self) -> None:
        # The client may go away mid-answer (a cancelled call); there is then nothing to do.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._handle_post()

    def _handle_post(self) -> None:
        if self.path.split("?")[0] != "/v1/messages":
            self._send_error(404, "not_found_error", f"no route {self.path}")
            return
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length).decode("utf-8")
        try:
            body = json.loads(raw)
        except ValueError:
            self._send_error(400, "invalid_request_error", "body is not JSON")
            return
        index, cached = self.fake._record(
            raw, body, {k.lower(): v for k, v in self.headers.items()}
        )
        problem = _validate(body)
        if problem:
            self._send_error(400, "invalid_request_error", problem)
            return
        reply = self.fake._next_reply(body)
        if isinstance(reply, str):
            self._send_error(500, "api_error", reply)
            return
        usage = _usage(reply, raw, cached)
        if self.fake.block_cache is not None:
            use = self.fake._use_cache(body)
            usage["input_tokens"] = use.uncached
            usage["cache_read_input_tokens"] = use.read
            usage["cache_creation_input_tokens"] = use.written
        self._answer(reply, body, usage, index)

    def _answer(
        self, reply: ServerReply, body: dict[str, Any], usage: dict[str, int], n: int
    ) -> None:
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if reply.hang:
            self.fake.stopping.wait()
            self.close_connection = True
        elif reply.status != 200:
            self._send_scripted_error(reply)
        elif body.get("stream"):
            self._send_stream(reply, body, usage, n)
        else:
            self._send_json(200, _message(reply, body, usage, n), reply.headers)

    # ---- plain JSON answers ------------------------------------------------------------------

    def _send_json(self, status: int, obj: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", "req_fake")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, kind: str, message: str) -> None:
        self._send_json(status, _error_body(kind, message), {})

    def _send_scripted_error(self, reply: ServerReply) -> None:
        kind = _ERROR_TYPES.get(reply.status, "api_error")
        body = reply.error_body or _error_body(kind, f"fake error {reply.status}")
        self._send_json(reply.status, body, reply.headers)

    # ---- streamed answers --------------------------------------------------------------------

    def _send_stream(
        self, reply: ServerReply, body: dict[str, Any], usage: dict[str, int], n: int
    ) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        self.send_header("request-id", "req_fake")
        for key, value in reply.headers.items():
            self.send_header(key, value)
        self.end_headers()
        frames = [_frame(event) for event in _stream_events(reply, body, usage, n)]
        if reply.malformed_event:
            # After the first content_block_start, where a client is mid-reply.
            frames.insert(2, "event: content_block_delta\ndata: {not json\n\n")
        for count, frame in enumerate(_endless(reply, frames)):
            if reply.cut_after_events is not None and count >= reply.cut_after_events:
                self._cut()
                return
            if not go_on(reply, count, self.fake.stopping):
                return
            self._write_chunk(frame.encode("utf-8"))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _cut(self) -> None:
        """Drop the connection without the terminating chunk, like a network failure."""
        self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


# ---- wire content ----------------------------------------------------------------------------


def _error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _frame(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def _validate(body: dict[str, Any]) -> str | None:
    """The checks the real API makes that an adapter is most likely to get wrong."""
    if not isinstance(body.get("model"), str) or not isinstance(body.get("max_tokens"), int):
        return "model (string) and max_tokens (integer) are required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: must be user or assistant"
        if not content:
            return f"messages.{i}: all messages must have non-empty content"
        if isinstance(content, list):
            for j, block in enumerate(content):
                if block.get("type") == "text" and not str(block.get("text", "")).strip():
                    return f"messages.{i}.content.{j}.text: text content blocks must be non-empty"
    if json.dumps(body).count('"cache_control"') > _MAX_CACHE_BREAKPOINTS:
        return f"A maximum of {_MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided."
    return None


def _tool_calls(reply: ServerReply, n: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(id, name, args) for each scripted call; ids are stable per request so tests can
    predict them."""
    calls = []
    for j, call in enumerate(reply.tool_calls):
        if len(call) == 3:
            calls.append((call[0], call[1], call[2]))
        else:
            calls.append((f"toolu_fake_{n}_{j}", call[0], call[1]))
    return calls


def _usage(reply: ServerReply, raw: str, cached_estimate: int) -> dict[str, int]:
    total = reply.input_tokens if reply.input_tokens is not None else len(raw) // 4
    cached = reply.cached_tokens if reply.cached_tokens is not None else cached_estimate
    cached = min(cached, total)
    written = min(reply.cache_write_tokens, total - cached)
    produced = reply.text + (reply.thinking or "") + json.dumps([c[1:] for c in reply.tool_calls])
    output = reply.output_tokens if reply.output_tokens is not None else max(1, len(produced) // 4)
    return {
        "input_tokens": total - cached - written,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": written,
        "output_tokens": output,
    }


def _stop_reason(reply: ServerReply) -> str:
    return reply.stop or ("tool_use" if reply.tool_calls else "end_turn")


def _content(reply: ServerReply, n: int) -> list[dict[str, Any]]:
    """The reply's content blocks, complete, in wire order: thinking, text, tool uses."""
    blocks: list[dict[str, Any]] = []
    if reply.thinking is not None:
        signature = reply.thinking_signature or ""
        blocks.append({"type": "thinking", "thinking": reply.thinking, "signature": signature})
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    for call_id, name, args in _tool_calls(reply, n):
        blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
    return blocks


def _message(
    reply: ServerReply, body: dict[str, Any], usage: dict[str, int], n: int
) -> dict[str, Any]:
    return {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", ""),
        "content": _content(reply, n),
        "stop_reason": _stop_reason(reply),
        "stop_sequence": None,
        "usage": usage,
    }


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _block_events(index: int, block: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """content_block_start, its deltas in small pieces, content_block_stop."""
    kind = block["type"]
    deltas: list[dict[str, Any]] = []
    start: dict[str, Any]
    if kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"], size)]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"], size)
        ]
        if block["signature"]:
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        args = json.dumps(block["input"])
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in _pieces(args, size)]
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": index},
    ]


def _endless(reply: ServerReply, frames: list[str]) -> Iterator[str]:
    """The frames; for an endless reply, its text or a tool call's input growing without end
    after the scripted blocks (message_delta and message_stop never come)."""
    if reply.endless is None:
        yield from frames
        return
    yield from frames[:-2]
    index = len(_content(reply, 0))
    start: dict[str, Any]
    if reply.endless == "text":
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": ENDLESS_TEXT}
    else:
        start = {"type": "tool_use", "id": "toolu_endless", "name": "endless", "input": {}}
        delta = {"type": "input_json_delta", "partial_json": ENDLESS_ARGS}
    yield _frame({"type": "content_block_start", "index": index, "content_block": start})
    while True:
        yield _frame({"type": "content_block_delta", "index": index, "delta": delta})


def _stream_events(
    reply: ServerReply, body: dict[str, Any], usage: dict[str, int], n: int
) -> list[dict[str, Any]]:
    start = _message(reply, body, {**usage, "output_tokens": 1}, n)
    start.update(content=[], stop_reason=None)
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(_content(reply, n)):
        events.extend(_block_events(index, block, reply.chunk_size))
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return events
