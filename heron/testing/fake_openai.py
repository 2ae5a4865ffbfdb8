"""A real HTTP server on 127.0.0.1 that speaks OpenAI chat completions from a script.

Used by the adapter tests, by end-to-end tests running the `heron` CLI in a subprocess, and by
benchmarks sending hundreds of requests, so it keeps connections alive (chunked SSE) and records
every request body and header set it receives.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from heron.testing.script import (
    ENDLESS_ARGS,
    ENDLESS_TEXT,
    Script,
    ServerReply,
    common_prefix,
    go_on,
)

_ERROR_DEFAULTS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "permission_denied"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


class FakeOpenAIServer:
    def __init__(
        self,
        script: Script,
        models: list[str] | None = None,
        window: int | None = None,
        dialect: Literal["openai", "llamacpp"] = "openai",
    ) -> None:
        self.script = script
        self.models = models or ["fake-model"]
        # A real server refuses a prompt longer than its context window: with `window` set, so
        # does this one (prompt tokens counted as a quarter of the body's bytes, as in usage),
        # in the words of OpenAI (and vLLM) or of llama.cpp's server (`dialect`).
        self.window = window
        self.dialect = dialect
        self.over_window = 0  # requests refused for their size
        self.largest_prompt = 0  # tokens of the largest request received
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self.stopping = threading.Event()  # ends hanging, stalled and endless replies
        self._served = 0
        self._last_messages = ""
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> str:
        self.stopping.clear()
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.fake = self
        self._httpd = httpd
        # A short poll interval keeps stop() fast (shutdown waits for the next poll).
        self._thread = threading.Thread(
            target=httpd.serve_forever, args=(0.05,), name="fake-openai", daemon=True
        )
        self._thread.start()
        self.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        return self.base_url

    def stop(self) -> None:
        if self._httpd is None:
            return
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> FakeOpenAIServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- script ------------------------------------------------------------------------------

    def _too_large(self, size: int) -> bool:
        """Count the request's size; True when the window is enforced and it does not fit."""
        with self._lock:
            self.largest_prompt = max(self.largest_prompt, size // 4)
            if self.window is None or size // 4 <= self.window:
                return False
            self.over_window += 1
            return True

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[ServerReply, int]:
        """Record the request and pick its reply; also returns the cached-prefix estimate."""
        # A provider's prompt cache covers what the template renders first: tools, then messages.
        prompt = [body.get("tools", []), body.get("messages", [])]
        messages = json.dumps(prompt, ensure_ascii=False, separators=(",", ":"))
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            cached = common_prefix(messages, self._last_messages) // 4
            self._last_messages = messages
            index = self._served
            self._served += 1
            if callable(self.script):
                return self.script(body), cached
            if index >= len(self.script):
                n = len(self.script)
                msg = f"FakeOpenAIServer: script exhausted (request {index + 1}, {n} replies)"
                return ServerReply(status=500, error_body=_error(msg, "server_error", None)), 0
            return self.script[index], cached


def _overflow(tokens: int, window: int, dialect: str = "openai") -> dict[str, Any]:
    """The error body OpenAI (or llama.cpp's server) sends for a prompt over the window."""
    if dialect == "llamacpp":
        said = (
            f"request ({tokens} tokens) exceeds the available context size ({window} tokens),"
            " try increasing it"
        )
        error = {"code": 400, "message": said, "type": "exceed_context_size_error"}
        return {"error": {**error, "n_prompt_tokens": tokens, "n_ctx": window}}
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages"
        f" resulted in {tokens} tokens. Please reduce the length of the messages."
    )
    return _error(message, "invalid_request_error", "context_length_exceeded")


def _error(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code}}


# ---- HTTP --------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 resets bursts of concurrent clients
    fake: FakeOpenAIServer  # set by FakeOpenAIServer.start


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: benchmarks send hundreds of requests
    timeout = 30  # an idle keep-alive connection frees its thread eventually
    # Many small flushed SSE writes + Nagle + delayed ACK would cost ~40 ms per request.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    @property
    def fake(self) -> FakeOpenAIServer:
        return self.server.fake

    def _routed(self) -> bool:
        """Whether the path is under /v1, as every route of a real server is; any other path
        gets the plain-text 404 of ollama's (Go's) router, what a base URL without /v1 meets."""
        if self.path.startswith("/v1/"):
            return True
        data = b"404 page not found"
        self.send_response(404)
        self.send_header("content-type", "text/plain; charset=utf-8")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return False

    def do_GET(self) -> None:
        if not self._routed():
            return
        if self.path.rstrip("/").endswith("/models"):
            data = [{"id": m, "object": "model", "owned_by": "fake"} for m in self.fake.models]
            self._json(200, {"object": "list", "data": data})
        else:
            self._json(404, _error(f"no route GET {self.path}", "invalid_request_error", None))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if not self._routed():
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, _error(f"no route POST {self.path}", "invalid_request_error", None))
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as e:
            self._json(400, _error(f"body is not JSON: {e}", "invalid_request_error", None))
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.fake._too_large(len(raw)):
            fake = self.fake
            self._json(400, _overflow(len(raw) // 4, fake.window or 0, fake.dialect))
            return
        reply, cached = self.fake._next(body, headers)
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if reply.hang:
            self.fake.stopping.wait()
            self.close_connection = True
            return
        if reply.status != 200:
            self._fail(reply)
            return
        usage = _usage(reply, body, len(raw), cached)
        if body.get("stream"):
            _Stream(self, reply, body, usage).send()
        else:
            self._json(200, _completion(reply, body, usage))

    def _fail(self, reply: ServerReply) -> None:
        type_, code = _ERROR_DEFAULTS.get(reply.status, ("server_error", "server_error"))
        default = _error(f"fake error {reply.status}", type_, code)
        self._json(reply.status, reply.error_body or default, reply.headers)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


# ---- replies -----------------------------------------------------------------------------------


def _calls(reply: ServerReply) -> list[tuple[str, str, str]]:
    """(id, name, arguments) with arguments as the wire string; a str arg is sent verbatim so
    tests can script invalid JSON."""
    out = []
    for i, call in enumerate(reply.tool_calls):
        call_id, name, args = call if len(call) == 3 else (f"call_{i}", *call)
        out.append((call_id, name, args if isinstance(args, str) else json.dumps(args)))
    return out


def _finish(reply: ServerReply) -> str:
    return reply.stop or ("tool_calls" if reply.tool_calls else "stop")


def _usage(reply: ServerReply, body: dict[str, Any], size: int, cached: int) -> dict[str, Any]:
    prompt = reply.input_tokens if reply.input_tokens is not None else size // 4
    out_chars = len(reply.text) + len(reply.thinking or "")
    out_chars += sum(len(n) + len(a) for _, n, a in _calls(reply))
    output = reply.output_tokens if reply.output_tokens is not None else max(1, out_chars // 4)
    read = reply.cached_tokens if reply.cached_tokens is not None else min(cached, prompt)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": read},
    }


def _completion(reply: ServerReply, body: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.thinking:
        message["reasoning_content"] = reply.thinking
    calls = _calls(reply)
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(reply)}],
        "usage": usage,
    }


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


class _Stream:
    """Writes one reply as chunked SSE, honouring cut_after_events and malformed_event."""

    def __init__(
        self, handler: _Handler, reply: ServerReply, body: dict[str, Any], usage: dict[str, Any]
    ) -> None:
        self.h = handler
        self.reply = reply
        self.body = body
        self.usage = usage
        self.sent = 0
        self.base = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", ""),
        }

    def send(self) -> None:
        self.h.send_response(200)
        self.h.send_header("content-type", "text/event-stream")
        self.h.send_header("cache-control", "no-cache")
        self.h.send_header("transfer-encoding", "chunked")
        for name, value in self.reply.headers.items():
            self.h.send_header(name, value)
        self.h.end_headers()
        try:
            for line in self._lines():
                if not self._write(line):
                    self.h.close_connection = True  # cut: no terminating chunk
                    return
            self.h.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.h.close_connection = True  # the client went away; nothing to tell it

    def _write(self, data: str) -> bool:
        cut = self.reply.cut_after_events
        if cut is not None and self.sent >= cut:
            return False
        if not go_on(self.reply, self.sent, self.h.fake.stopping):
            return False
        payload = f"data: {data}\n\n".encode()
        self.h.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.h.wfile.flush()
        self.sent += 1
        return True

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return json.dumps({**self.base, "choices": [choice]})

    def _lines(self) -> Iterator[str]:
        yield from self._content_lines()
        if self.reply.endless == "text":
            while True:
                yield self._chunk({"content": ENDLESS_TEXT})
        if self.reply.endless == "tool_args":
            index = len(self.reply.tool_calls)
            head = {"index": index, "id": "call_endless", "type": "function"}
            head["function"] = {"name": "endless", "arguments": '{"a": "'}
            yield self._chunk({"tool_calls": [head]})
            while True:
                frag = {"index": index, "function": {"arguments": ENDLESS_ARGS}}
                yield self._chunk({"tool_calls": [frag]})
        yield from self._end_lines()

    def _content_lines(self) -> list[str]:
        r = self.reply
        lines = [self._chunk({"role": "assistant", "content": ""})]
        if r.malformed_event:
            lines.append("{this is not json")
        for piece in _pieces(r.thinking or "", r.chunk_size):
            lines.append(self._chunk({"reasoning_content": piece}))
        for piece in _pieces(r.text, r.chunk_size):
            lines.append(self._chunk({"content": piece}))
        for index, (call_id, name, args) in enumerate(_calls(r)):
            head = {"index": index, "id": call_id, "type": "function"}
            head["function"] = {"name": name, "arguments": ""}
            lines.append(self._chunk({"tool_calls": [head]}))
            for piece in _pieces(args, max(1, min(r.chunk_size, len(args) // 3 or 1))):
                frag = {"index": index, "function": {"arguments": piece}}
                lines.append(self._chunk({"tool_calls": [frag]}))
        return lines

    def _end_lines(self) -> list[str]:
        lines = [self._chunk({}, _finish(self.reply))]
        asked = (self.body.get("stream_options") or {}).get("include_usage")
        if asked and not self.reply.no_usage:
            lines.append(json.dumps({**self.base, "choices": [], "usage": self.usage}))
        lines.append("[DONE]")
        return lines
