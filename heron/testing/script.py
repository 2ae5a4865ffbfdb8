"""What a fake model server answers, described independently of the wire.

Both fake servers (Messages API and chat completions) take a script: a list of `ServerReply`
served in order, or a function of the decoded JSON request body returning one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class ServerReply:
    text: str = ""
    # (name, args) pairs, or (id, name, args) triples when the id matters.
    tool_calls: list[tuple[Any, ...]] = field(default_factory=list)
    thinking: str | None = None
    thinking_signature: str | None = None  # Anthropic: sent back byte-exact on the next request
    stop: str | None = None  # wire stop reason; derived from tool_calls when None
    input_tokens: int | None = None  # None: estimated from the request size
    output_tokens: int | None = None
    cached_tokens: int | None = None  # None: the longest common prefix with the last request
    cache_write_tokens: int = 0
    # Failure modes:
    status: int = 200  # an HTTP error status instead of a reply
    error_body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)  # e.g. {"retry-after": "1"}
    cut_after_events: int | None = None  # close the connection after this many SSE events
    malformed_event: bool = False  # send one SSE data line that is not JSON
    delay_s: float = 0.0  # wait before answering (e.g. to kill the client mid-call)
    chunk_size: int = 8  # characters per streamed text delta
    no_usage: bool = False  # OpenAI wire: no usage chunk, as some proxies and older servers
    # Streams without bounds (each ends when the client goes away or the server stops):
    hang: bool = False  # read the request and never answer, not even the headers
    stall_after_events: int | None = None  # send this many SSE events, then nothing, kept open
    # With stall_after_events: the stream goes on once this is set (a reply paused mid-stream
    # for as long as a test needs, e.g. while it types into the chat).
    resume: threading.Event | None = None
    endless: Literal["text", "tool_args"] | None = None  # after `text`, deltas without end


# What an endless stream repeats: a text delta, or a piece of a tool call's arguments.
ENDLESS_TEXT = "and more "
ENDLESS_ARGS = "aaaaaaaa"


Script = list[ServerReply] | Callable[[dict[str, Any]], ServerReply]


def common_prefix(a: str, b: str) -> int:
    """Length of the common prefix, compared in blocks so long histories stay cheap."""
    n, i, step = min(len(a), len(b)), 0, 4096
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def go_on(reply: ServerReply, sent: int, stopping: threading.Event) -> bool:
    """Whether a stream that sent `sent` events sends the next: at `stall_after_events` it
    waits for `resume` (when given) and goes on; without one, or once the server stops, it
    ends there, silently, the connection kept open until the server stops."""
    stalled = reply.stall_after_events is not None and sent >= reply.stall_after_events
    if stalled and reply.resume is not None:
        while not reply.resume.wait(0.05):  # two events to wait on: the resume, or a stop
            if stopping.is_set():
                return False
        stalled = False
    if stalled or stopping.is_set():
        stopping.wait()
        return False
    return True
