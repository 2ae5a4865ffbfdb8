"""Tool calls for models that cannot call tools natively.

`FencedTools` wraps any provider: the tool list goes into the system prompt as text, past calls
and results are rendered as text, and a fenced ```tool block in the model's plain-text reply is
parsed back into a ToolCall. The loop above never knows the difference.
"""

from __future__ import annotations

import hashlib
import json
import re

from heron.messages import JSONObject, Message, Part, Reply, Text, ToolCall, ToolResult
from heron.providers.base import Provider
from heron.request import ChatRequest, OnEvent

_BLOCK = re.compile(r"```tool[ \t]*\n(.*?)\n?```", re.DOTALL)

INSTRUCTIONS = """\
# Calling tools
You cannot call tools directly. To call one, write a fenced block and stop:
```tool
{"name": "<tool name>", "args": {<arguments>}}
```
The result comes back in the next message. Available tools:"""


def render_tools(request: ChatRequest) -> str:
    lines = [INSTRUCTIONS]
    for spec in request.tools:
        params = json.dumps(spec.parameters.get("properties", {}), separators=(",", ":"))
        lines.append(f"- {spec.name}: {spec.description} Arguments: {params}")
    return "\n".join(lines)


def _render_part(part: Part) -> Part:
    if isinstance(part, ToolCall):
        body = json.dumps({"name": part.name, "args": part.args}, ensure_ascii=False)
        return Text(f"```tool\n{body}\n```")
    if isinstance(part, ToolResult):
        status = "error" if part.is_error else "result"
        return Text(f"Tool {status} ({part.call_id}):\n{part.content}")
    return part


def to_text_messages(messages: list[Message]) -> list[Message]:
    return [Message(m.role, [_render_part(p) for p in m.parts]) for m in messages]


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split a reply into its prose and the tool calls written as fenced blocks."""
    calls: list[ToolCall] = []
    for index, match in enumerate(_BLOCK.finditer(text)):
        body = match.group(1).strip()
        call_id = "fenced_" + hashlib.sha256(f"{index}:{body}".encode()).hexdigest()[:12]
        try:
            data = json.loads(body)
            name, args = str(data["name"]), data.get("args", {})
            if not isinstance(args, dict):
                raise ValueError("args is not an object")
        except (ValueError, KeyError, TypeError):
            name, args = "invalid_tool_block", {"_raw": body}
        calls.append(ToolCall(call_id, name, args))
    prose = _BLOCK.sub("", text).strip() if calls else text
    return prose, calls


class FencedTools:
    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = inner.model

    def _wrap(self, request: ChatRequest) -> ChatRequest:
        system = request.system
        if request.tools:
            system = f"{system}\n\n{render_tools(request)}" if system else render_tools(request)
        return ChatRequest(
            request.model, system, to_text_messages(request.messages), [], request.max_tokens
        )

    def payload(self, request: ChatRequest) -> JSONObject:
        return self.inner.payload(self._wrap(request))

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        reply = await self.inner.chat(self._wrap(request), on_event)
        if not request.tools:
            return reply
        prose, calls = parse_tool_calls(reply.text)
        if not calls:
            return reply
        others = [p for p in reply.parts if not isinstance(p, Text)]
        parts: list[Part] = [*others, *([Text(prose)] if prose else []), *calls]
        return Reply(parts, "tool", reply.usage)

    async def aclose(self) -> None:
        await self.inner.aclose()
