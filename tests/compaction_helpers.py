"""Shared helpers for the context and compaction tests: a scripted model that reads files,
summarizes on request and writes checkpoints when asked."""

from __future__ import annotations

from collections.abc import Callable

from heron.compaction.summary import CHECKPOINT_INSTRUCTION, SUMMARY_SYSTEM
from heron.messages import Message, Reply, Text, ToolCall, Usage
from heron.request import ChatRequest
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool


def all_text(request: ChatRequest) -> str:
    """Everything the model receives in one request, as one string."""
    out = [request.system]
    for m in request.messages:
        for p in m.parts:
            out.append(getattr(p, "text", None) or getattr(p, "content", "") or "")
    return "\n".join(out)


def is_summary(request: ChatRequest) -> bool:
    return request.system == SUMMARY_SYSTEM


def is_checkpoint(request: ChatRequest) -> bool:
    last = request.messages[-1] if request.messages else None
    return bool(last) and any(CHECKPOINT_INSTRUCTION in getattr(p, "text", "") for p in last.parts)


class Model:
    """Answers turns: `tool_rounds` read_file calls per turn, then a short answer. Summaries
    come from `summarize` (junk by default)."""

    def __init__(
        self,
        tool_rounds: int = 1,
        tools_every: int = 1,
        summarize: Callable[[ChatRequest], Reply] | None = None,
        checkpoint: str = "## Request\nread the files\n## Current step\nreading",
        tool: str = "read_file",
        args: dict | None = None,
    ) -> None:
        self.tool = tool
        self.args = args or {"path": "big.txt"}
        self.tool_rounds = tool_rounds
        self.tools_every = tools_every  # only every n-th turn uses tools
        self.summarize = summarize or (lambda r: Reply([Text("## Facts\nblah blah")], "done"))
        self.checkpoint = checkpoint
        self.requests: list[ChatRequest] = []
        self.turn_requests: list[ChatRequest] = []
        self.n = 0
        self.calls_in_turn: dict[str, int] = {}

    def __call__(self, request: ChatRequest) -> Reply:
        self.requests.append(request)
        if is_summary(request):
            return self.summarize(request)
        if is_checkpoint(request):
            return Reply([Text(self.checkpoint)], "done", Usage(100, 10))
        self.turn_requests.append(request)
        key = _turn_key(request.messages)
        self.calls_in_turn[key] = self.calls_in_turn.get(key, 0) + 1
        uses_tools = len(self.calls_in_turn) % self.tools_every == 0
        if uses_tools and self.calls_in_turn[key] <= self.tool_rounds:
            self.n += 1
            return Reply([ToolCall(f"c{self.n}", self.tool, self.args)], "tool")
        return Reply([Text(f"done {self.n}")], "done", Usage(100, 10))


def _turn_key(messages: list[Message]) -> str:
    """The turn's request: the text of the last user message that is not tool results."""
    for m in reversed(messages):
        if m.role == "user" and not m.tool_results:
            return m.parts[0].text if m.parts else ""
    return ""


@tool
def fetch_report(ctx: ToolContext, n: int) -> str:
    """Fetch report number n.

    Args:
        n: The report number.
    """
    return f"report {n}\n" + "figures and findings " * 150


def report_registry() -> ToolRegistry:
    """One tool whose results are not micro-compacted, so a turn can fill the window."""
    return ToolRegistry([fetch_report])


def pointed_at(seen: str, row_id: int) -> bool:
    """Whether a request names row `row_id`: a pointer [#id], or inside a range [#a–#b]."""
    import re

    if f"[#{row_id}]" in seen:
        return True
    spans = re.findall(r"\[#(\d+)–#(\d+)\]", seen)
    return any(int(a) <= row_id <= int(b) for a, b in spans)


def reachable(seen: str, store, conversation_id: int, text: str) -> bool:
    """What the user wrote is whole in the request, or a pointer in it opens it whole with
    recall_history(message_id=...)."""
    if text in seen:
        return True
    from pathlib import Path

    from heron.memory.recall import Recall
    from heron.tools.context import ToolContext, TurnServices
    from heron.tools.memory_tools import recall_history

    ctx = ToolContext(workspace=Path("."), services=TurnServices(recall=Recall(store)))
    for row in store.all_messages(conversation_id):
        if row.role == "user" and row.message.text == text and pointed_at(seen, row.id):
            return text in recall_history.fn(ctx, message_id=row.id)
    return False
