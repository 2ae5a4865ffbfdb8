"""Make a history the provider will accept: every tool call answered, no result without a call.

A crash or a stop in the middle of a tool leaves a call with no result; providers reject such a
history. The record keeps what happened; this only shapes what is sent.
"""

from __future__ import annotations

from heron.messages import Message, Part, ToolResult

INTERRUPTED = "interrupted: the run stopped before this call returned a result"


def repair_tool_pairs(messages: list[Message]) -> list[Message]:
    out: list[Message] = []
    pending: list[str] = []  # call ids of the last assistant message still unanswered
    for message in messages:
        if message.role == "assistant":
            if pending:
                out.append(_answers(pending))
            pending = [c.id for c in message.tool_calls]
            out.append(message)
            continue
        results = message.tool_results
        if message.role == "user" and message.parts and not pending and not results:
            out.append(message)  # the common case: nothing to answer, nothing to drop
            continue
        answered = {r.call_id for r in results}
        parts: list[Part] = [
            p for p in message.parts if not isinstance(p, ToolResult) or p.call_id in pending
        ]
        missing = [
            ToolResult(cid, INTERRUPTED, is_error=True) for cid in pending if cid not in answered
        ]
        pending = []
        merged = [*missing, *parts]
        if merged:
            out.append(Message("user", merged))
    if pending:
        out.append(_answers(pending))
    return out


def _answers(call_ids: list[str]) -> Message:
    return Message("user", [ToolResult(cid, INTERRUPTED, is_error=True) for cid in call_ids])


def is_well_formed(messages: list[Message]) -> bool:
    """True when every call has a result in the next message and every result has its call."""
    for i, message in enumerate(messages):
        if message.role == "assistant" and message.tool_calls:
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            got = {r.call_id for r in nxt.tool_results} if nxt and nxt.role == "user" else set()
            if {c.id for c in message.tool_calls} - got:
                return False
        if message.role == "user" and message.tool_results:
            prev = messages[i - 1] if i > 0 else None
            calls = {c.id for c in prev.tool_calls} if prev and prev.role == "assistant" else set()
            if {r.call_id for r in message.tool_results} - calls:
                return False
    return True
