"""A provider for tests and replay: answers from a script instead of a model.

The script is a list of replies (or exceptions to raise) served in order, or a function of the
request. Every request is recorded; an extra call fails loudly, and `assert_complete()` catches
replies left unserved.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable

from heron.messages import JSONObject, Reply, Text, Thinking, message_to_dict
from heron.providers.wire import ToolsMemo
from heron.request import ChatRequest, OnEvent, StreamEvent, ToolSpec

ScriptStep = Reply | BaseException
ScriptFn = Callable[[ChatRequest], Reply | Awaitable[Reply]]


class ScriptExhausted(AssertionError):
    pass


class ScriptedProvider:
    name = "scripted"

    def __init__(
        self,
        script: list[ScriptStep] | ScriptFn,
        *,
        model: str = "scripted",
        latency_s: float = 0.0,
    ) -> None:
        self.model = model
        self._steps = list(script) if isinstance(script, list) else None
        self._fn = None if isinstance(script, list) else script
        self.latency_s = latency_s
        self.requests: list[ChatRequest] = []
        self._tools = ToolsMemo()

    def payload(self, request: ChatRequest) -> JSONObject:
        return {
            "model": self.model,
            "system": request.system,
            "messages": [message_to_dict(m) for m in request.messages],
            "tools": self._tools.get(request.tools, _wire_tool),
            "max_tokens": request.max_tokens,
        }

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        self.requests.append(request)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        reply = await self._next(request)
        if on_event:
            for part in reply.parts:
                if isinstance(part, Thinking) and part.text:
                    on_event(StreamEvent("thinking", part.text))
                elif isinstance(part, Text) and part.text:
                    on_event(StreamEvent("text", part.text))
        return reply

    async def _next(self, request: ChatRequest) -> Reply:
        if self._fn is not None:
            result = self._fn(request)
            return await result if inspect.isawaitable(result) else result
        assert self._steps is not None
        if not self._steps:
            last = json.dumps(message_to_dict(request.messages[-1]))[:300]
            raise ScriptExhausted(f"scripted provider: no reply left for request ending {last}")
        step = self._steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    def assert_complete(self) -> None:
        if self._steps:
            raise AssertionError(f"{len(self._steps)} scripted replies were never requested")

    async def aclose(self) -> None:
        return None


def _wire_tool(spec: ToolSpec) -> JSONObject:
    return {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
