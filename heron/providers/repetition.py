"""The repetition guard: a reply that falls into a loop is stopped while it streams.

A small model easily loops ("1. Hello! 2. Hello! 3. Hello! ...") and then runs on to its output
cap, which on a CPU takes minutes. The guard reads the streamed text as it arrives, as tokens of
words and runs of punctuation (a close enough stand-in for the model's own tokens, and the same
for every provider), with letters lower-cased and digits folded into `#` so that a numbered list
of the same line still counts as one line said again. When the last `ngram` tokens have already
appeared `repeats - 1` times earlier in the reply, the reply is looping: the guard stops reading
the stream (closing it, so the server stops generating) and the reply is kept as it was streamed,
with a marker the user sees and the stop reason `repetition`.

The runner also asks `repeats_itself` of a reply cut by the output cap before it asks the model
to continue: a cut loop is not continued, whichever model wrote it.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from heron.messages import Reply, Text, Usage
from heron.providers.base import Provider
from heron.request import ChatRequest, OnEvent, StreamEvent

NGRAM = 10  # tokens in the span that must come back
REPEATS = 3  # a span seen this many times is a loop
MARKER = "\n\n[Heron stopped this reply here: it was repeating itself.]"

_TOKEN = re.compile(r"\w+|[^\w\s]+")
_DIGITS = re.compile(r"\d+")


@dataclass
class LoopDetector:
    """Counts every span of `ngram` tokens of a text fed in pieces; `looping` once a span has
    come back `repeats` times. Each token costs one dict update, so it keeps up with any stream."""

    ngram: int = NGRAM
    repeats: int = REPEATS
    tokens: int = 0  # tokens read so far
    looping: bool = False
    _window: deque[str] = field(default_factory=deque, repr=False)
    _seen: dict[tuple[str, ...], int] = field(default_factory=dict, repr=False)
    _pending: str = ""  # the last token of a piece, which the next piece may continue

    def feed(self, text: str) -> bool:
        """Read the next piece of the reply; True once the reply is looping."""
        text = self._pending + text
        self._pending = ""
        matches = list(_TOKEN.finditer(text))
        if matches and matches[-1].end() == len(text):
            self._pending = matches.pop().group()
        for match in matches:
            if self._add(match.group()):
                break
        return self.looping

    def finish(self) -> bool:
        """The reply is complete: read the token held back."""
        pending, self._pending = self._pending, ""
        if pending:
            self._add(pending)
        return self.looping

    def _add(self, token: str) -> bool:
        self.tokens += 1
        self._window.append(_DIGITS.sub("#", token.lower()))
        if len(self._window) > self.ngram:
            self._window.popleft()
        if len(self._window) == self.ngram:
            span = tuple(self._window)
            count = self._seen.get(span, 0) + 1
            self._seen[span] = count
            self.looping = self.looping or count >= self.repeats
        return self.looping


def repeats_itself(text: str) -> bool:
    """Whether a whole text already holds a loop."""
    detector = LoopDetector()
    return detector.feed(text) or detector.finish()


class _Looping(Exception):
    """Raised from the stream callback: it unwinds the adapter's read of the stream (whose
    `async with` closes the connection) back to `guarded_chat`, and nowhere else."""


async def guarded_chat(provider: Provider, request: ChatRequest, on_event: OnEvent | None) -> Reply:
    """`provider.chat(request, on_event)`, stopped as soon as the streamed text loops.

    A stopped reply keeps the text streamed so far, marker appended (also streamed, so every
    channel shows it); reasoning streamed before it is dropped (it cannot be sent back without
    the provider's signature). Its usage is unknown: the output is counted in guard tokens and
    the input left at 0, which the calibration of token estimates skips.
    """
    detector = LoopDetector()
    streamed: list[str] = []

    def watch(event: StreamEvent) -> None:
        if on_event is not None:
            on_event(event)
        if event.kind == "text":
            streamed.append(event.text)
            if detector.feed(event.text):
                raise _Looping

    try:
        return await provider.chat(request, watch)
    except _Looping:
        pass
    if on_event is not None:
        on_event(StreamEvent("text", MARKER))
    return Reply([Text("".join(streamed) + MARKER)], "repetition", Usage(output=detector.tokens))
