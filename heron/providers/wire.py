"""A request body encoded once and used three times: sent by the adapter, recorded in the trace,
and compared by a replay.

Encoding the body is a large share of a turn's cost on a busy engine: the tool schemas alone are
several kilobytes, the same on every call. So the adapter builds its tools list once per set of
specs (`ToolsMemo`, an `EncodedList` that knows its own canonical JSON), and `body_of` encodes
a request's body once per provider, keeping each top-level field's encoding (`WireBody.pieces`)
so the trace stores it by reference without parsing the text again. `ModelCallRecord` is one
model call as sent and answered, whoever made it (the runner, compaction): what the trace
records.

Pure data: no I/O, no SDK.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from heron.messages import (
    File,
    JSONObject,
    JSONValue,
    Part,
    Reply,
    Usage,
    dumps,
    file_class,
    part_from_dict,
    part_to_dict,
    size_label,
    usage_from_dict,
    usage_to_dict,
)
from heron.request import ChatRequest, OnEvent, ToolSpec

MESSAGES = "messages"


class EncodedList(list[JSONValue]):
    """A list whose canonical JSON (`json`) was made when it was built. Still a plain list to
    every JSON encoder; `encode_body` takes `json` instead of walking it again."""

    json: str

    @classmethod
    def of(cls, items: Sequence[JSONValue]) -> EncodedList:
        out = cls(items)
        out.json = dumps(items)
        return out


class EncodedDict(dict[str, JSONValue]):
    """A dict whose canonical JSON (`json`) was made once, for a value encoded again and again
    as part of a larger one (a model profile in every run's trace)."""

    json: str

    @classmethod
    def of(cls, items: JSONObject) -> EncodedDict:
        out = cls(items)
        out.json = dumps(items)
        return out


def encoded(value: object) -> str:
    """`dumps(value)`, taking the kept JSON of an EncodedList or EncodedDict."""
    return value.json if isinstance(value, EncodedList | EncodedDict) else dumps(value)


def dumps_fields(value: JSONObject) -> str:
    """`dumps(value)` for a dict whose fields may be kept encodings (sorted keys, no spaces)."""
    return "{" + ",".join(dumps(k) + ":" + encoded(v) for k, v in sorted(value.items())) + "}"


class ToolsMemo:
    """The wire form of the last tools list an adapter built, reused while the specs are the
    same objects (the registry hands out the same ToolSpec instances every turn)."""

    def __init__(self) -> None:
        self._specs: tuple[ToolSpec, ...] = ()
        self._wire: EncodedList | None = None

    def get(
        self, specs: Sequence[ToolSpec], build: Callable[[ToolSpec], JSONObject]
    ) -> EncodedList:
        held = self._specs
        same = len(held) == len(specs) and all(a is b for a, b in zip(held, specs, strict=True))
        if self._wire is not None and same:
            return self._wire
        wire = EncodedList.of([build(s) for s in specs])
        self._specs, self._wire = tuple(specs), wire
        return wire


@dataclass(frozen=True)
class WireBody:
    """A request body: the value the adapter posts, its canonical JSON (`text`, what traces
    record), and each top-level field's part of that JSON (`pieces`; the messages one body per
    message)."""

    value: JSONObject
    text: str
    pieces: dict[str, list[str]]


def encode_body(value: JSONObject) -> WireBody:
    """`dumps(value)`, assembled from the encoding of each field (sorted keys, no spaces), so
    the same pieces serve the text and the trace's content-addressed storage."""
    pieces: dict[str, list[str]] = {}
    fields = []
    for key in sorted(value):
        item = value[key]
        if key == MESSAGES and isinstance(item, list):
            bodies = pieces[key] = [dumps(m) for m in item]
            text = "[" + ",".join(bodies) + "]"
        else:
            text = encoded(item)
            pieces[key] = [text]
        fields.append(dumps(key) + ":" + text)
    return WireBody(value, "{" + ",".join(fields) + "}", pieces)


class _Payloads(Protocol):
    def payload(self, request: ChatRequest) -> JSONObject: ...


def body_of(provider: _Payloads, request: ChatRequest) -> WireBody:
    """The provider's body for `request`, encoded once per request and provider: the runner
    records it, and the adapter's `chat` posts the same value without building it again."""
    memo = request.memo
    held = memo.get("wire")
    if held is not None and held[0] is provider and isinstance(held[1], WireBody):
        return held[1]
    body = encode_body(provider.payload(request))
    memo["wire"] = (provider, body)
    return body


@dataclass(frozen=True)
class FailedAttempt:
    """An attempt of a model call that failed and was tried again (a 529, a stream cut): its
    error as a call's row records one (the exception's repr), the wait before the next attempt
    and when it failed. The trace keeps it beside its call, so two calls counted and one
    reply shown can be told apart."""

    error: str
    wait: float
    at: float


@dataclass
class ModelCallRecord:
    """One model call: the exact body sent (no credentials), its reply or error, and when."""

    seq: int  # the call's number in its run (the recorder renumbers compaction's)
    purpose: str  # turn | wrapup | continue | a compaction call's purpose
    payload: str  # the body's canonical JSON text
    reply: Reply | None
    error: str | None
    started: float
    ended: float
    body: WireBody | None = None  # the payload's encoded pieces, stored by the trace as they are
    streamed: Streamed | None = None  # a call stopped mid-stream: what had arrived
    failed: tuple[FailedAttempt, ...] = ()  # attempts before the last that failed, tried again

    @property
    def retried(self) -> int:
        """Attempts sent before the last: each is a model call of the turn's figures."""
        return len(self.failed)


class Asked(Protocol):
    """A provider as `call_recorded` uses it (heron/providers/base.py Provider)."""

    def payload(self, request: ChatRequest) -> JSONObject: ...

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply: ...


async def call_recorded(
    provider: Asked,
    request: ChatRequest,
    purpose: str,
    sink: Callable[[ModelCallRecord], Awaitable[None]],
    on_event: OnEvent | None = None,
) -> Reply:
    """One model call made outside the runner (a summary, a memory review), handed to `sink`
    with its exact body, its reply or its error (then raised again): what a trace records.
    The request sent is the one given; the body is encoded beside it, not instead."""
    payload = dumps(provider.payload(request))
    started = time.time()
    try:
        reply = await provider.chat(request, on_event)
    except Exception as e:
        await sink(ModelCallRecord(0, purpose, payload, None, repr(e), started, time.time()))
        raise
    await sink(ModelCallRecord(0, purpose, payload, reply, None, started, time.time()))
    return reply


# The error of a call stopped mid-stream (Ctrl-C, /stop), as its trace row records it; a call
# that broke on its own after it began streaming records its error beside what streamed.
STOPPED = "stopped before the reply ended (Ctrl-C or /stop): its usage is not all known"


@dataclass(frozen=True)
class Streamed:
    """What a model call had streamed when it was stopped (Ctrl-C, /stop) before its end: the
    text and reasoning as they arrived, and the usage the provider had sent by then (None: it
    sent none). The call's full usage is unknown: its output was billed but never counted."""

    parts: list[Part]
    usage: Usage | None = None


def streamed_to_dict(streamed: Streamed) -> JSONObject:
    usage = None if streamed.usage is None else usage_to_dict(streamed.usage)
    return {"parts": [part_to_dict(p) for p in streamed.parts], "usage": usage}


def streamed_from_dict(d: JSONObject) -> Streamed:
    parts = d.get("parts")
    usage = d.get("usage")
    if not isinstance(parts, list):
        raise ValueError("the streamed parts are not a list")
    return Streamed(
        [part_from_dict(p) for p in parts], None if usage is None else usage_from_dict(usage)
    )


# ---- attachments -------------------------------------------------------------------------------


def file_label(part: File) -> str:
    """'cat.png (image/png, 56 bytes)', 'r.pdf (application/pdf, 1.2 MB, 12 pages)': a file as
    the transcripts and summaries name it."""
    pages = f", {part.pages:,} pages" if part.pages > 0 else ""
    return f"{part.name or 'file'} ({part.media_type}, {size_label(part.size)}{pages})"


_WHAT = {"image": "image", "pdf": "PDF", "text": "text file", "file": "file"}
_REFUSED = {
    "image": "this model does not take images",
    "pdf": "this model does not take PDFs",
    "file": "this model takes no files of this type",
}


def file_note(part: File, reason: str | None = None) -> str:
    """The short text a model gets in place of a file it cannot take (or whose bytes are not
    kept any more): what it was, its name and size, and why it is not there."""
    kind = file_class(part)
    name = part.name or "file"
    what = _WHAT[kind] if kind != "file" else f"file ({part.media_type})"
    if reason is None:
        reason = "its bytes are no longer kept" if part.data is None else _REFUSED[kind]
    return f"[{what} {name}, {size_label(part.size)}: {reason}]"


def takes_file(part: File, *, vision: bool, pdf: bool) -> bool:
    """Whether a model with these abilities gets `part` as a file (else a `file_note`)."""
    if part.data is None:
        return False
    kind = file_class(part)
    return kind == "text" or (kind == "image" and vision) or (kind == "pdf" and pdf)
