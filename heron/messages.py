"""The provider-neutral message model: pure data, no I/O, no Heron imports.

A conversation is a list of `Message`s, each a role and a list of parts. Tool results travel in
user messages (as in the Anthropic wire), so a history alternates user and assistant. Every type
round-trips losslessly through plain JSON (`to_json` / `from_json`); `Thinking.provider_state` is
an opaque string handed back to the provider byte for byte. A `File` is the exception that
proves the rule: its JSON holds its name, type, size and sha256, never its bytes, which the store
keeps content-addressed beside the database (heron/store/files.py) and puts back when asked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeAlias

Role = Literal["user", "assistant"]
# "repetition": the repetition guard stopped a looping reply (heron/providers/repetition.py).
StopReason = Literal["done", "tool", "length", "repetition"]
STOP_REASONS: tuple[StopReason, ...] = typing.get_args(StopReason)
# JSON: tool arguments, wire bodies, the meta stored with a message. A reader narrows what it
# takes out (`isinstance`), so a damaged value fails where it is read. The containers inside a
# value are read-only types (Sequence, Mapping), so that a `list[JSONObject]` built by an adapter
# is a JSONValue too (a `list` of them would not be: list is invariant).
JSONValue: TypeAlias = (
    "str | int | float | bool | Sequence[JSONValue] | Mapping[str, JSONValue] | None"
)
JSONObject: TypeAlias = "dict[str, JSONValue]"


def new_key(prefix: str = "c") -> str:
    """A fresh conversation key, `<prefix>-<local date-time>-<4 hex>` ("run-20261203-070102-
    9f3a"): readable in lists, sorted by when it started, and unlikely to meet another."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def key_problem(key: str) -> str | None:
    """Why `key` cannot name a conversation, or None: a blank key could not be told apart from
    another, and control characters (a newline, a tab, an escape) break every list's columns."""
    import unicodedata

    if not key.strip():
        return f"a conversation key cannot be blank ({key!r})"
    if any(unicodedata.category(c) == "Cc" for c in key):
        return (
            "a conversation key cannot hold control characters (a newline, a tab, an escape): "
            f"{key!r}"
        )
    return None


@dataclass(frozen=True)
class Text:
    text: str
    kind: Literal["text"] = "text"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: JSONObject = field(default_factory=dict)
    kind: Literal["tool_call"] = "tool_call"


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    content: str
    is_error: bool = False
    kind: Literal["tool_result"] = "tool_result"


@dataclass(frozen=True)
class Thinking:
    """Reasoning. `provider_state` is opaque (a signature, an encrypted blob) and is only ever sent
    back to the provider named in `provider`."""

    text: str | None = None
    provider_state: str | None = None
    provider: str | None = None
    kind: Literal["thinking"] = "thinking"


@dataclass(frozen=True)
class File:
    """An attachment (heron/attachments.py). `data` is None when the part was read from a row
    whose bytes were not loaded (`Store.load_files` loads them): `size` and `sha256` always say
    which bytes it means, so a part without them still names, sizes and compares its file.
    `pages` is a PDF's page count, read once when it was attached and stored with the part, so
    that its context estimate is the same with or without its bytes (0: not a PDF, or one that
    could not be read)."""

    media_type: str
    data: bytes | None = None
    name: str | None = None
    size: int = -1  # -1: len(data)
    sha256: str = ""  # "": the hash of data
    pages: int = 0
    kind: Literal["file"] = "file"

    def __post_init__(self) -> None:
        if self.data is not None:
            if self.size < 0:
                object.__setattr__(self, "size", len(self.data))
            if not self.sha256:
                object.__setattr__(self, "sha256", hashlib.sha256(self.data).hexdigest())
        elif not self.sha256:
            raise ValueError("a File needs its bytes or their sha256")

    def __eq__(self, other: object) -> bool:
        # The bytes are the sha256's: loaded or not, two parts naming one file are equal.
        if not isinstance(other, File):
            return NotImplemented
        return (self.media_type, self.name, self.size, self.sha256, self.pages) == (
            other.media_type,
            other.name,
            other.size,
            other.sha256,
            other.pages,
        )

    def __hash__(self) -> int:
        return hash((self.media_type, self.name, self.sha256))

    def without_data(self) -> File:
        if self.data is None:
            return self
        return File(self.media_type, None, self.name, self.size, self.sha256, self.pages)

    def with_data(self, data: bytes) -> File:
        return File(self.media_type, data, self.name, self.size, self.sha256, self.pages)


Part = Text | ToolCall | ToolResult | Thinking | File


@dataclass(frozen=True)
class Message:
    role: Role
    parts: tuple[Part, ...]
    # Who wrote it when the role does not tell (Heron's own prompts and injected results say
    # "heron"), and the meta it is stored with: class attributes a subclass sets, not fields,
    # so they take no part in equality or in the JSON.
    author: ClassVar[str | None] = None
    meta: ClassVar[JSONObject | None] = None

    def __init__(self, role: Role, parts: Iterable[Part]) -> None:
        object.__setattr__(self, "role", role)
        object.__setattr__(self, "parts", tuple(parts))

    @property
    def parts_json(self) -> str | None:
        """The canonical JSON of the parts when it is in hand already (a stored row); None."""
        return None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, Text))

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [p for p in self.parts if isinstance(p, ToolResult)]


def user(text: str) -> Message:
    return Message("user", [Text(text)])


def assistant(text: str) -> Message:
    return Message("assistant", [Text(text)])


@dataclass(frozen=True)
class Usage:
    """Tokens of one model call. `input` counts the whole prompt, cache reads and writes
    included, so `input - cache_read - cache_write` is what was paid at the full rate."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input + other.input,
            self.output + other.output,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
        )

    @property
    def total(self) -> int:
        return self.input + self.output


@dataclass(frozen=True)
class Reply:
    parts: tuple[Part, ...]
    stop: StopReason
    usage: Usage = Usage()
    # The provider never counted the call (a reply cut at its output cap before an
    # OpenAI-compatible stream's closing usage): `usage` is a floor, not the call's tokens.
    usage_unknown: bool = False

    def __init__(
        self,
        parts: Iterable[Part],
        stop: StopReason,
        usage: Usage | None = None,
        usage_unknown: bool = False,
    ) -> None:
        object.__setattr__(self, "parts", tuple(parts))
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "usage", usage or Usage())
        object.__setattr__(self, "usage_unknown", usage_unknown)

    @property
    def message(self) -> Message:
        return Message("assistant", self.parts)

    @property
    def text(self) -> str:
        return self.message.text

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.message.tool_calls


def size_label(size: int) -> str:
    """'812 bytes', '123 kB', '4.2 MB', '3.1 GB' (of 1,024)."""
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{round(size / 1024)} kB"
    if size < 1024**3:
        return f"{size / (1024 * 1024):.1f} MB"
    return f"{size / 1024**3:.1f} GB"


def file_label(part: File) -> str:
    """'notes.txt (2 kB)': an attachment as a person reads it in a list."""
    return f"{part.name or 'file'} ({size_label(part.size)})"


def file_class(part: File) -> str:
    """What a model is asked to take a file as: "image", "pdf", "text" or "file"."""
    media_type = part.media_type
    if media_type.startswith("image/"):
        return "image"
    if media_type == "application/pdf":
        return "pdf"
    if media_type.startswith("text/") or media_type == "application/json":
        return "text"
    return "file"


def decode_text(data: bytes) -> tuple[str, int]:
    """`data` as UTF-8 with each invalid byte sequence replaced by U+FFFD, and how many were:
    bad input is kept, marked, never rejected."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        return text, text.count("\ufffd") - data.decode("utf-8", "ignore").count("\ufffd")


def scrub_text(text: str) -> tuple[str, int]:
    """`text` with lone surrogates (undecodable bytes of a command line or a file name, kept
    by Python as surrogate escapes, which cannot be stored) decoded as `decode_text` does."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return decode_text(text.encode("utf-8", errors="surrogateescape"))
    return text, 0


# The most UTF-8 bytes one message the person sends may hold, in every mode: through a serve it
# travels as one JSON line of the control socket (heron/serve/control.py, 64 MB), and escaped
# JSON can take up to six bytes per character of text.
MESSAGE_LIMIT = 8 * 1024 * 1024


def oversized(text: str) -> str | None:
    """Why `text` is too large to send as one message, or None when it is not."""
    if len(text) <= MESSAGE_LIMIT // 4:  # at most 4 bytes a character: surely fits
        return None
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size <= MESSAGE_LIMIT:
        return None
    return (
        f"the message is {size / 2**20:.1f} MB; one message holds at most "
        f"{MESSAGE_LIMIT // 2**20} MB. Save it as a file in the workspace and ask about the file"
    )


# ---- JSON ------------------------------------------------------------------------------------


def part_to_dict(part: Part) -> JSONObject:
    if isinstance(part, Text):
        return {"kind": "text", "text": part.text}
    if isinstance(part, ToolCall):
        return {"kind": "tool_call", "id": part.id, "name": part.name, "args": part.args}
    if isinstance(part, ToolResult):
        return {
            "kind": "tool_result",
            "call_id": part.call_id,
            "content": part.content,
            "is_error": part.is_error,
        }
    if isinstance(part, Thinking):
        return {
            "kind": "thinking",
            "text": part.text,
            "provider_state": part.provider_state,
            "provider": part.provider,
        }
    if isinstance(part, File):
        # By reference: a row of the record never holds a file's bytes (the store keeps them).
        out: JSONObject = {
            "kind": "file",
            "media_type": part.media_type,
            "name": part.name,
            "sha256": part.sha256,
            "size": part.size,
        }
        if part.pages:  # only when counted: the JSON of every other file is as it always was
            out["pages"] = part.pages
        return out
    raise TypeError(f"not a message part: {part!r}")


def part_from_dict(d: JSONValue) -> Part:
    """A part from its JSON; ValueError or TypeError when `d` is not one (a damaged row): the
    types are checked, so nothing downstream meets an object where text belongs."""
    # Spelled out per kind rather than generic: histories of 10,000 messages are decoded on
    # every turn, and this is the inner loop.
    if type(d) is not dict:
        raise TypeError(f"a part must be an object, not {type(d).__name__}")
    kind = d.get("kind")
    if kind == "text":
        return Text(_str(d["text"], "text"))
    if kind == "tool_call":
        args = d.get("args", {})
        if type(args) is not dict:
            raise TypeError(f"tool call arguments must be an object, not {type(args).__name__}")
        return ToolCall(_str(d["id"], "id"), _str(d["name"], "name"), args)
    if kind == "tool_result":
        content = _str(d["content"], "content")
        return ToolResult(_str(d["call_id"], "call_id"), content, d.get("is_error") is True)
    if kind == "thinking":
        text, state, provider = d.get("text"), d.get("provider_state"), d.get("provider")
        provider = _opt_str(provider, "provider")
        return Thinking(_opt_str(text, "text"), _opt_str(state, "provider_state"), provider)
    if kind == "file":
        name = _opt_str(d.get("name"), "name")
        if "data" in d:  # a row written before files were kept by reference: bytes inline
            data = base64.b64decode(_str(d["data"], "data"))
            return File(_str(d["media_type"], "media_type"), data, name)
        size = d.get("size")
        if type(size) is not int:
            raise TypeError(f"size must be a number, not {type(size).__name__}")
        sha256 = _str(d["sha256"], "sha256")
        pages = d.get("pages", 0)  # rows written before pages were counted have none: unknown
        if type(pages) is not int or pages < 0:
            raise TypeError(f"pages must be a count, not {pages!r}")
        return File(_str(d["media_type"], "media_type"), None, name, size, sha256, pages)
    raise ValueError(f"unknown part kind {kind!r}")


def _str(value: JSONValue, key: str) -> str:
    if type(value) is not str:
        raise TypeError(f"{key} must be text, not {type(value).__name__}")
    return value


def _opt_str(value: JSONValue, key: str) -> str | None:
    return None if value is None else _str(value, key)


def message_to_dict(message: Message) -> JSONObject:
    return {"role": message.role, "parts": [part_to_dict(p) for p in message.parts]}


def message_from_dict(d: JSONObject) -> Message:
    role = d.get("role")
    if role != "user" and role != "assistant":
        raise ValueError(f"unknown role {role!r}")
    parts = [part_from_dict(p) for p in _list(d["parts"], "parts")]
    return Message("user" if role == "user" else "assistant", parts)


def _list(value: JSONValue, key: str) -> list[JSONValue]:
    if type(value) is not list:
        raise TypeError(f"{key} must be a list, not {type(value).__name__}")
    return value


def usage_to_dict(usage: Usage) -> JSONObject:
    return {
        "input": usage.input,
        "output": usage.output,
        "cache_read": usage.cache_read,
        "cache_write": usage.cache_write,
    }


def usage_from_dict(d: JSONValue) -> Usage:
    if type(d) is not dict:
        raise TypeError(f"usage must be an object, not {type(d).__name__}")
    return Usage(*(_int(d.get(k, 0), k) for k in ("input", "output", "cache_read", "cache_write")))


def _int(value: JSONValue, key: str) -> int:
    if not isinstance(value, (int, float, str)):
        raise TypeError(f"{key} must be a number, not {type(value).__name__}")
    return int(value)


def reply_to_dict(reply: Reply) -> JSONObject:
    unknown: JSONObject = {"usage_unknown": True} if reply.usage_unknown else {}
    return {
        "parts": [part_to_dict(p) for p in reply.parts],
        "stop": reply.stop,
        "usage": usage_to_dict(reply.usage),
        **unknown,
    }


def reply_from_dict(d: JSONObject) -> Reply:
    stop = next((s for s in STOP_REASONS if s == d["stop"]), None)
    if stop is None:
        raise ValueError(f"unknown stop reason {d['stop']!r}")
    parts = [part_from_dict(p) for p in _list(d["parts"], "parts")]
    unknown = d.get("usage_unknown") is True
    return Reply(parts, stop, usage_from_dict(d.get("usage", {})), usage_unknown=unknown)


# What json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True) builds on
# every call; built once (it holds no state between calls), as a turn encodes thousands of parts.
_CANONICAL = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)
_encode_str = json.encoder.encode_basestring  # what the encoder uses with ensure_ascii=False


def dumps(obj: object) -> str:
    """Canonical JSON: the same value always gives the same bytes (content addressing relies
    on it). A plain string or int is written directly, as the encoder itself would write it:
    a turn encodes dozens of keys and roles, and the encoder's call costs more than the text."""
    if type(obj) is str:
        return _encode_str(obj)
    if type(obj) is int:
        return int.__repr__(obj)
    return _CANONICAL.encode(obj)


def message_json(message: Message) -> str:
    """`dumps(message_to_dict(message))`. A message that still holds the canonical JSON of its
    parts (`parts_json`: a stored row, as written) is not decoded and encoded again."""
    raw = message.parts_json
    if raw is not None:
        return '{"parts":' + raw + ',"role":' + dumps(message.role) + "}"
    return dumps(message_to_dict(message))


def parts_to_json(parts: tuple[Part, ...] | list[Part]) -> str:
    return dumps([part_to_dict(p) for p in parts])


def parts_from_json(text: str) -> list[Part]:
    parts = json.loads(text)
    if type(parts) is not list:
        raise TypeError(f"parts must be a list, not {type(parts).__name__}")
    return [part_from_dict(p) for p in parts]


def to_json(message: Message) -> str:
    return dumps(message_to_dict(message))


def from_json(text: str) -> Message:
    return message_from_dict(json.loads(text))


def plural(count: int, noun: str) -> str:
    """`count` and its noun, singular for one: "1 turn", "2 turns", "1,000 turns"."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def title_of(text: str) -> str:
    """A conversation's title from the text that opens it: its first line, cut at 60."""
    line = text.strip().splitlines()[0] if text.strip() else "(empty)"
    return line[:60] + ("…" if len(line) > 60 else "")
