"""Token estimation that works offline, calibrated per model from the usage replies report.

The raw estimate counts four ASCII characters or one non-ASCII character as a token, which is
close for English prose and code under the common BPE vocabularies and errs high for JSON. A
per-model factor (reported input tokens / estimated tokens of the same request, averaged) turns
it into that model's count; the factor is kept in the store, so it survives restarts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from heron.messages import (
    File,
    Message,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    dumps,
    file_class,
)
from heron.request import ToolSpec

PER_MESSAGE = 4  # role markers and separators
FILE_TOKENS = 1_000  # an image, or a PDF whose pages are unknown, whatever its bytes
# A PDF goes to the model page by page. Anthropic's PDF support page: each page's text costs
# 1,500 to 3,000 tokens by its density, and each page is also sent as an image (about 1,600
# tokens at most, its cap for one image); OpenAI's file inputs likewise give a vision model
# each page's text and an image of the page (an image at high detail is about 1,100 tokens).
# 3,000 a page errs high on purpose: an estimate too low lets a request overflow the window
# (the provider refuses it), one too high only hands the file to the view's share earlier.
PDF_PAGE_TOKENS = 3_000
MIN_FACTOR, MAX_FACTOR = 0.5, 2.5


def estimate_text(text: str) -> int:
    if text.isascii():
        return (len(text) + 3) // 4
    wide = sum(1 for ch in text if ord(ch) > 127)
    return (len(text) - wide + 3) // 4 + wide


def estimate_message(message: Message) -> int:
    total = PER_MESSAGE
    for part in message.parts:
        if isinstance(part, Text):
            total += estimate_text(part.text)
        elif isinstance(part, ToolCall):
            total += estimate_text(part.name + dumps(part.args)) + 8
        elif isinstance(part, ToolResult):
            total += estimate_text(part.content) + 8
        elif isinstance(part, Thinking):
            total += estimate_text(part.text or "") + estimate_text(part.provider_state or "")
        elif isinstance(part, File):
            total += file_tokens(part)
    return total


def file_tokens(part: File) -> int:
    """An attachment's estimate, the same before and after its bytes are read: a text file
    goes to the model as its text (four bytes a token); a PDF counts PDF_PAGE_TOKENS a page
    (the count its part keeps); an image, or a PDF of unknown pages, FILE_TOKENS."""
    kind = file_class(part)
    if kind == "text":
        return (max(part.size, 0) + 3) // 4
    if kind == "pdf" and part.pages > 0:
        return part.pages * PDF_PAGE_TOKENS
    return FILE_TOKENS


def estimate_messages(messages: Iterable[Message]) -> int:
    return sum(estimate_message(m) for m in messages)


def estimate_tools(tools: Iterable[ToolSpec]) -> int:
    return sum(estimate_text(t.name + t.description + t.parameters_json) + 8 for t in tools)


@dataclass(frozen=True)
class Calibration:
    """How a model's tokenizer relates to the raw estimate."""

    factor: float = 1.0
    samples: int = 0

    def tokens(self, raw: int) -> int:
        return int(raw * self.factor + 0.5)

    def observe(self, estimated: int, reported: int) -> Calibration:
        """Fold in one request: its raw estimate and the input tokens the provider reported."""
        if estimated <= 0 or reported <= 0:
            return self
        ratio = min(MAX_FACTOR, max(MIN_FACTOR, reported / estimated))
        weight = 1 / min(self.samples + 1, 20)  # a running mean that keeps adapting
        return Calibration(self.factor + (ratio - self.factor) * weight, self.samples + 1)


@dataclass(frozen=True)
class Estimate:
    system: int
    tools: int
    messages: int

    @property
    def total(self) -> int:
        return self.system + self.tools + self.messages


def estimate_request(
    system: str, tools: Iterable[ToolSpec], messages: Iterable[Message], cal: Calibration
) -> Estimate:
    return Estimate(
        cal.tokens(estimate_text(system)),
        cal.tokens(estimate_tools(tools)),
        cal.tokens(estimate_messages(messages)),
    )
