"""A block-level model of Anthropic's prompt cache, for the fake server and the benchmarks.

Anthropic's prompt-caching docs say: the prompt is cached in the order tools, system, messages;
an entry is written at each `cache_control` breakpoint (at most 4 a request) for the prefix up to
and including that block; and a lookup goes from each breakpoint back over at most about 20
block boundaries for the longest prefix already written. So a cached prefix more than 20 blocks
before every breakpoint of a request is not found, even when the bytes are identical.

`BlockCache.use(body)` applies those rules to a Messages API body and returns what the real API
would report: tokens read from the cache, written to it, and neither. A block's size is its
canonical JSON over four characters; entries never expire (a run is shorter than the 5-minute
lifetime).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

LOOKBACK = 20  # block boundaries checked before each breakpoint


@dataclass(frozen=True)
class CacheUse:
    read: int  # cache_read_input_tokens
    written: int  # cache_creation_input_tokens
    uncached: int  # input_tokens
    breakpoints: int


def blocks_of(body: dict[str, Any]) -> list[tuple[str, bool]]:
    """The body's cacheable blocks in cache order, each as (canonical JSON, has a breakpoint)."""
    out: list[tuple[str, bool]] = []

    def add(prefix: str, block: dict[str, Any]) -> None:
        rest = {k: v for k, v in block.items() if k != "cache_control"}
        out.append((prefix + json.dumps(rest, sort_keys=True), "cache_control" in block))

    for tool in body.get("tools") or []:
        add("tool:", tool)
    system = body.get("system")
    if isinstance(system, str):
        out.append(("system:" + system, False))
    for block in system or [] if not isinstance(system, str) else []:
        add("system:", block)
    for message in body.get("messages") or []:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content:
            add(message["role"] + ":", block)
    return out


@dataclass
class BlockCache:
    entries: set[str] = field(default_factory=set)  # digests of the prefixes written

    def use(self, body: dict[str, Any]) -> CacheUse:
        blocks = blocks_of(body)
        sizes = [max(1, len(text) // 4) for text, _ in blocks]
        digests: list[str] = []
        running = hashlib.sha256()
        for text, _ in blocks:
            running.update(text.encode() + b"\x00")
            digests.append(running.copy().hexdigest())
        marks = [i for i, (_, marked) in enumerate(blocks) if marked]
        hit = 0  # blocks read from the cache
        for mark in marks:
            for i in range(mark, max(-1, mark - LOOKBACK), -1):
                if digests[i] in self.entries:
                    hit = max(hit, i + 1)
                    break
        end = marks[-1] + 1 if marks else 0
        self.entries.update(digests[m] for m in marks)
        read = sum(sizes[:hit])
        written = sum(sizes[hit:end])
        return CacheUse(read, written, sum(sizes) - read - written, len(marks))
