"""What a GGUF model file says about its model, read from its header with the standard library.

A local model given by path is profiled from its own file, not from its name (a renamed file is
the same model): the context length it was trained on, its chat template (whether it takes
tools) and its size. The header is the metadata (key/value pairs) followed by the list of
tensors (name, shape, type, offset); the tensors' data after it, which is nearly all of the
file, is never read. The `gguf` package from llama.cpp reads the same, but it needs numpy and
maps the whole file; this is the part Heron needs (spec: ggml's docs/gguf.md).
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from heron.errors import ConfigError

MAGIC = b"GGUF"
# Value types (the spec's gguf_metadata_value_type): fixed sizes, then STRING and ARRAY.
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
# Bounds that no real header comes near: a damaged or hostile file fails fast instead of
# making the reader walk gigabytes or allocate a huge string.
MOST_KEYS = 1 << 20
MOST_TENSORS = 1 << 22
MOST_ITEMS = 1 << 28
LONGEST_STRING = 64 << 20
MOST_DIMS = 8
MOST_DEPTH = 16  # arrays within arrays: real headers hold none
CHUNK = 1 << 16


class GgufError(ConfigError):
    """The file is not a GGUF file this reader understands, or its header is damaged."""


@dataclass(frozen=True)
class GgufFacts:
    """The header's facts a profile is made from (None: the file does not say)."""

    name: str | None = None  # general.name
    architecture: str | None = None  # general.architecture ("llama", "qwen2", ...)
    context_length: int | None = None  # <architecture>.context_length: the trained window
    chat_template: str | None = None  # tokenizer.chat_template (Jinja)
    parameters: int | None = None  # general.parameter_count, else summed from the tensor shapes
    size_label: str | None = None  # general.size_label ("135M", "7B")
    # Bytes llama.cpp's key/value cache takes per token of the window (f16, its default):
    # every layer keeps a key and a value vector per KV head. None: the header does not say.
    kv_bytes_per_token: int | None = None

    @property
    def takes_tools(self) -> bool:
        """Whether its chat template can put tools in the prompt: a template that never names
        `tools` drops them, and the model has never seen a tool call."""
        return bool(self.chat_template and re.search(r"\btools\b", self.chat_template))


class _Reader:
    """Reads a stream forward in chunks; `skip` moves past bytes without keeping them."""

    def __init__(self, stream: BinaryIO, endian: str = "<") -> None:
        self.stream = stream
        self.endian = endian
        self.buf = b""
        self.pos = 0

    def _have(self, n: int) -> None:
        if len(self.buf) - self.pos >= n:
            return
        rest = self.buf[self.pos :]
        more = self.stream.read(max(CHUNK, n - len(rest)))
        self.buf, self.pos = rest + more, 0
        if len(self.buf) < n:
            raise GgufError("the GGUF header ends early: the file is cut or damaged")

    def take(self, n: int) -> bytes:
        self._have(n)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        while n > 0:
            self._have(min(n, CHUNK))
            step = min(n, len(self.buf) - self.pos)
            self.pos += step
            n -= step

    def value(self, code: str) -> int | float | bool:
        size = struct.calcsize(code)
        self._have(size)
        (out,) = struct.unpack_from(self.endian + code, self.buf, self.pos)
        self.pos += size
        return out  # type: ignore[no-any-return]

    def u32(self) -> int:
        return int(self.value("I"))

    def u64(self) -> int:
        return int(self.value("Q"))

    def skip_strings(self, count: int) -> None:
        """Past `count` strings (a vocabulary: 50,000 to 250,000 of them), in one tight loop."""
        length = struct.Struct(self.endian + "Q")
        for _ in range(count):
            if len(self.buf) - self.pos < 8:
                self._have(8)
            (n,) = length.unpack_from(self.buf, self.pos)
            self.pos += 8
            if n > LONGEST_STRING:
                raise GgufError(f"the GGUF header holds a string of {n:,} bytes: it is damaged")
            if len(self.buf) - self.pos >= n:
                self.pos += n
            else:
                self.skip(n)

    def string(self, keep: bool = True) -> str:
        n = self.u64()
        if n > LONGEST_STRING:
            raise GgufError(f"the GGUF header holds a string of {n:,} bytes: the file is damaged")
        if not keep:
            self.skip(n)
            return ""
        return self.take(n).decode("utf-8", errors="replace")


def _value(r: _Reader, kind: int, keep: bool, depth: int = 0) -> object:
    """One metadata value; arrays and values nobody asked for are skipped, not built. Arrays
    nest at most MOST_DEPTH deep: a crafted file nesting thousands ran the reader out of
    stack (a RecursionError's traceback instead of "damaged")."""
    if depth > MOST_DEPTH:
        raise GgufError("the GGUF header nests arrays too deep: the file is damaged")
    if kind in _FIXED:
        return r.value(_FIXED[kind])
    if kind == STRING:
        return r.string(keep)
    if kind != ARRAY:
        raise GgufError(f"the GGUF header holds a value of unknown type {kind}")
    item, count = r.u32(), r.u64()
    if count > MOST_ITEMS:
        raise GgufError(f"the GGUF header holds an array of {count:,} items: the file is damaged")
    if item in _FIXED:
        r.skip(count * struct.calcsize(_FIXED[item]))
    elif item == STRING:
        r.skip_strings(count)
    else:
        for _ in range(count):  # nested arrays
            _value(r, item, keep=False, depth=depth + 1)
    return None


WANTED = ("general.name", "general.architecture", "general.parameter_count", "general.size_label")
WANTED_SUFFIX = ".context_length"
# The shape keys the cache's size is computed from (`<architecture>.` before each).
SHAPE = (
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
)
TEMPLATE = "tokenizer.chat_template"


def read_header(stream: BinaryIO) -> GgufFacts:
    """The facts of the GGUF header at the start of `stream`, reading no tensor data."""
    if stream.read(4) != MAGIC:
        raise GgufError("not a GGUF file (it does not start with GGUF)")
    r = _Reader(stream)
    version = r.u32()
    if version > 0xFFFF:  # a big-endian file: the version reads byte-swapped
        r.endian = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version < 2:  # version 1 (2023) used 32-bit counts; llama.cpp no longer loads it
        raise GgufError(f"GGUF version {version} is too old; convert the model again")
    tensors, keys = r.u64(), r.u64()
    if keys > MOST_KEYS or tensors > MOST_TENSORS:
        raise GgufError("the GGUF header's counts are out of range: the file is damaged")
    found: dict[str, object] = {}
    for _ in range(keys):
        key = r.string()
        kind = r.u32()
        wanted = key in WANTED or key == TEMPLATE or key.endswith(WANTED_SUFFIX)
        wanted = wanted or key.split(".", 1)[-1] in SHAPE
        value = _value(r, kind, keep=wanted)
        if wanted:
            found[key] = value
    return _facts(found, _parameters(r, tensors))


def _parameters(r: _Reader, tensors: int) -> int | None:
    """The model's size: the element counts of its tensors, summed from their shapes."""
    total = 0
    for _ in range(tensors):
        r.string(keep=False)
        dims = r.u32()
        if dims > MOST_DIMS:
            raise GgufError(f"a tensor in the GGUF header has {dims} dimensions: damaged")
        total += math.prod(r.u64() for _ in range(dims))
        r.skip(4 + 8)  # its type and its data's offset
    return total or None


def _facts(found: dict[str, object], counted: int | None) -> GgufFacts:
    def text(key: str) -> str | None:
        value = found.get(key)
        return value if isinstance(value, str) and value else None

    def number(key: str) -> int | None:
        value = found.get(key)
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return int(value) if ok else None  # type: ignore[call-overload]

    arch = text("general.architecture")
    context = number(f"{arch}.context_length") if arch else None
    if context is None:  # an architecture key the general section does not name
        context = next((number(k) for k in found if k.endswith(WANTED_SUFFIX) and number(k)), None)
    return GgufFacts(
        name=text("general.name"),
        architecture=arch,
        context_length=context,
        chat_template=text(TEMPLATE),
        parameters=number("general.parameter_count") or counted,
        size_label=text("general.size_label"),
        kv_bytes_per_token=_kv_bytes(lambda key: number(f"{arch}.{key}")) if arch else None,
    )


def _kv_bytes(number: Callable[[str], int | None]) -> int | None:
    """The cache's bytes per token from the model's shape: layers x (key + value length) x KV
    heads x 2 bytes. A head's length defaults to the embedding split over the heads; KV heads
    to the heads (no grouped-query attention); a per-layer list is not read (None: the heads,
    an upper bound)."""
    layers, width, heads = (
        number("block_count"),
        number("embedding_length"),
        number("attention.head_count"),
    )
    if layers is None or width is None or heads is None:
        return None
    kv_heads = number("attention.head_count_kv") or heads
    key = number("attention.key_length") or width // heads
    value = number("attention.value_length") or width // heads
    return layers * (key + value) * kv_heads * 2


# The share of the machine's memory a local model's cache may take by default: the weights,
# the rest of Heron and the person's own programs need the remainder. A window asked for
# (`[models."<glob>"] context_window`, HERON_CONTEXT_WINDOW) may go past it, up to the trained one.
CACHE_SHARE = 0.25
# Never below this by default (an agent's system prompt and tools need it); a machine whose
# memory cannot hold it cannot hold the model's weights either.
LEAST_WINDOW = 4_096


def fitting_window(facts: GgufFacts, memory: int | None) -> int | None:
    """The largest window (a multiple of 1,024) whose cache fits CACHE_SHARE of `memory`
    bytes, at least LEAST_WINDOW; None when the header does not give the shape or memory is
    unknown. A model trained on 128k tokens asked for its whole window took 16 GB for an 8B
    model's cache before its first word."""
    per_token = facts.kv_bytes_per_token
    if per_token is None or not memory:
        return None
    fits = int(memory * CACHE_SHARE) // per_token // 1_024 * 1_024
    return max(fits, LEAST_WINDOW)


def physical_memory() -> int | None:
    """The machine's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def read_gguf(path: Path) -> GgufFacts:
    """The facts of the GGUF file at `path`; a file that is no GGUF is a ConfigError."""
    stat = os.stat(path)
    return _read_cached(str(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _read_cached(path: str, size: int, mtime_ns: int) -> GgufFacts:
    # Keyed by size and time too: a file replaced in place is read again. A large vocabulary
    # takes tens of milliseconds to walk, and a process asks for its model more than once.
    try:
        with open(path, "rb") as stream:
            return read_header(stream)
    except GgufError as e:
        raise GgufError(
            f"{path}: {e.summary}", hint="Give the path to a GGUF model file (llama.cpp's format)."
        ) from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
