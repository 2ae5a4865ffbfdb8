"""Tools as the model sees them, and the one place their calls are run.

A tool is a typed Python function (sync or async) whose first parameter is `ctx: ToolContext`.
Its JSON schema comes from the type hints (through pydantic), its description from the
docstring: the first paragraph describes the tool, the `Args:` section its parameters.

`ToolRegistry.call` never raises an `Exception`: an unknown tool, invalid arguments, a veto or a
failure all become an `is_error` result that says what was wrong, because the model can only act
on what it reads. A result longer than the budget is saved under `.heron/results/` in the
workspace (heron/saved.py) and the model gets its head and its end (where a tool says how it
ended: an exit code, a footer) around the saved path, so nothing is lost.
The built-in tools are listed in builtin.py, which imports them and this module; what a tool is
given when it runs is `ToolContext` (context.py). Every result is first scrubbed of secrets
(`ToolContext.redactor`, heron/redact.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import json
import re
import threading
import types
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin, overload

from heron.errors import ToolError
from heron.messages import JSONObject, JSONValue, ToolCall, ToolResult
from heron.request import ToolSpec
from heron.saved import READ_ON, cut_middle, keep, keep_whole
from heron.tools.context import CALL_ID, ToolContext, recording

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic_core import ErrorDetails

    from heron.redact import Redactor


BeforeCall = Callable[[ToolCall, "ToolContext"], "str | Awaitable[str | None] | None"]
# Told when a call's tool starts to run, after any wait for its turn to write.
OnStart = Callable[[], None]
# A tool's function: its ToolContext first, then the arguments its hints declare; what it returns
# (text, a ToolOutput, JSON-ready data or None, or an awaitable of one) becomes the result.
ToolFn = Callable[..., object]

# Tool calls of one reply that run at once: a reply asking for 1,000 calls must not start 1,000
# processes, kernels or threads together.
MAX_PARALLEL_TOOLS = 8


_T = typing.TypeVar("_T")


async def bounded_gather(
    calls: Sequence[Callable[[], Awaitable[_T]]], limit: int = MAX_PARALLEL_TOOLS
) -> list[_T]:
    """Await every call, at most `limit` at a time; results in the order of `calls`."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[_T]]) -> _T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(one(c) for c in calls)))


@dataclass(frozen=True)
class ToolOutput:
    """What a tool returns when its text is a failure the model should see as one (a command
    that exited non-zero) rather than an exception."""

    text: str
    is_error: bool = False
    # More of it than `text` when `text` is cut for the model (a command's head and tail):
    # kept for the person's /show N, never sent (heron/saved.py `keep_whole`).
    whole: str | None = None


# ---- schema from hints and docstrings --------------------------------------------------------

_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The first paragraph (lines joined) and the `Args:` descriptions of a docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        summary.append(line.strip())
    return " ".join(summary), _parse_args(lines)


def _parse_args(lines: list[str]) -> dict[str, str]:
    args: dict[str, list[str]] = {}
    current: str | None = None
    base: int | None = None  # indent of the parameter lines; deeper lines continue one
    inside = False
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped and indent == 0:
            inside = stripped in ("Args:", "Arguments:", "Parameters:")
            current, base = None, None
            continue
        if not inside or not stripped:
            continue
        match = _ARG_LINE.match(stripped)
        if match and (base is None or indent <= base):
            current, base = match.group(1), indent
            args[current] = [match.group(2)]
        elif current is not None:
            args[current].append(stripped)
    return {name: " ".join(p for p in parts if p) for name, parts in args.items()}


def _lean(schema: JSONValue) -> JSONValue:
    """Drop pydantic's "title" keys and collapse `X | None = None` to X: the schema is sent on
    every request, and an optional parameter is already expressed by leaving it out of
    "required"."""
    if isinstance(schema, list):
        return [_lean(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: JSONObject = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        out[key] = value if key in ("default", "enum", "const", "examples") else _lean(value)
    options = out.get("anyOf")
    nullable = isinstance(options, list) and len(options) == 2 and {"type": "null"} in options
    if nullable and isinstance(options, list) and "default" in out and out["default"] is None:
        other = next(o for o in options if o != {"type": "null"})
        if isinstance(other, Mapping):
            del out["anyOf"], out["default"]
            out = {**other, **out}
    return out


def _args_model(fn: ToolFn, name: str, docs: dict[str, str]) -> type[BaseModel]:
    from pydantic import ConfigDict, Field, create_model

    hints = typing.get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())[1:]  # skip ctx
    fields: dict[str, Any] = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args/**kwargs cannot be described to a model")
        default = ... if param.default is param.empty else param.default
        annotation = hints.get(param.name, Any)
        fields[param.name] = (annotation, Field(default, description=docs.get(param.name)))
    config = ConfigDict(extra="forbid")
    return create_model(f"{name}_args", __config__=config, **fields)


# Plain hints whose pydantic schema is known (pydantic sorts a schema's keys, except in
# "properties"): the schemas of such tools are written without importing pydantic, which
# costs more at start-up than anything else before the first request.
# tests/test_tool_schema_plain.py holds them equal, key order included, to pydantic's.
NONE = type(None)
_PLAIN: dict[object, str] = {str: "string", int: "integer", bool: "boolean", float: "number"}


def _plain_type(hint: object) -> JSONObject | None:
    if hint in _PLAIN:
        return {"type": _PLAIN[hint]}
    args = get_args(hint)
    if get_origin(hint) is list and len(args) == 1 and args[0] in _PLAIN:
        return {"items": {"type": _PLAIN[args[0]]}, "type": "array"}
    strings = all(type(a) is str for a in args) and len(set(args)) == len(args) > 1
    if get_origin(hint) is Literal and strings:
        return {"enum": list(args), "type": "string"}
    return None


def _plain_property(hint: object, default: object, description: str | None) -> JSONObject | None:
    """The leaned schema of one parameter, or None when pydantic must say it (`default` is
    `...` for a required one)."""
    scalar = default is None or isinstance(default, str | int | float)
    if description == "" or not (scalar or default is ...):
        return None
    args = get_args(hint)
    optional = get_origin(hint) in (Union, types.UnionType) and len(args) == 2 and args[1] is NONE
    if optional and default is None:  # `X | None = None`: leaned to X, then the rest
        inner = _plain_type(args[0])
        if inner is not None and description is not None:
            inner["description"] = description
        return inner
    schema = _plain_type(hint)
    if schema is None:
        return None
    if default is None or isinstance(default, str | int | float):
        schema["default"] = default
    if description is not None:
        schema["description"] = description
    return dict(sorted(schema.items()))


def _plain_schema(fn: ToolFn, docs: dict[str, str]) -> JSONObject | None:
    """The tool's leaned schema built from plain hints, or None (then pydantic builds it)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:
        return None
    properties: JSONObject = {}
    required: list[str] = []
    for param in list(inspect.signature(fn).parameters.values())[1:]:  # skip ctx
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            return None
        default = ... if param.default is param.empty else param.default
        prop = _plain_property(hints.get(param.name), default, docs.get(param.name))
        if prop is None:
            return None
        properties[param.name] = prop
        if default is ...:
            required.append(param.name)
    schema: JSONObject = {"properties": properties}
    if required:
        schema["required"] = required
    schema["type"] = "object"
    return schema


# ---- tools -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: JSONObject
    fn: ToolFn
    docs: dict[str, str] = field(default_factory=dict)  # the docstring's `Args:` descriptions
    writes: bool = False  # changes the workspace: runs alone (`ToolContext.write_lock`)

    @classmethod
    def from_function(cls, fn: ToolFn, name: str | None = None) -> Tool:
        tool_name = name or fn.__name__
        description, docs = parse_docstring(fn.__doc__)
        if not description:
            raise TypeError(f"tool {tool_name}: a docstring is needed to describe it to the model")
        schema = _plain_schema(fn, docs)
        if schema is not None:
            return cls(tool_name, description, schema, fn, docs)
        tool = cls(tool_name, description, {}, fn, docs)
        leaned = _lean(tool.args_model.model_json_schema())
        if not isinstance(leaned, dict):
            raise TypeError(f"tool {tool_name}: its schema is not a JSON object")
        # Unknown arguments are still refused (with a message naming them); saying so in the
        # schema would cost bytes on every request.
        leaned.pop("additionalProperties", None)
        tool.parameters.update(leaned)
        return tool

    @cached_property
    def args_model(self) -> type[BaseModel]:
        """The pydantic model that validates a call's arguments: built (and pydantic
        imported) at the first call, not at start-up."""
        return _args_model(self.fn, self.name, self.docs)

    @cached_property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.fn(*args, **kwargs)

    async def run(self, ctx: ToolContext, kwargs: Mapping[str, object]) -> object:
        fn = self.fn
        value: object
        if inspect.iscoroutinefunction(fn):
            value = fn(ctx, **kwargs)
        else:
            # A thread keeps a slow sync tool (grep over a big tree) from stalling its siblings.
            value = await in_thread(fn, ctx, **kwargs)
        return await value if inspect.isawaitable(value) else value


async def in_thread(fn: Callable[..., _T], /, *args: object, **kwargs: object) -> _T:
    """`fn(*args, **kwargs)` on a daemon thread of its own, awaited. Not the default executor:
    a tool's file I/O that blocks (a file system that hangs) must neither take the workers the
    serve's API needs nor hold the process's exit (the executor's threads are joined at exit,
    a daemon thread is not). A call that is cancelled leaves its thread to finish unheard."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(outcome: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: no one to tell
            loop.call_soon_threadsafe(lambda: None if future.done() else outcome())

    def work() -> None:
        try:
            value = context.run(fn, *args, **kwargs)
        except BaseException as error:  # handed to the awaiting task, as to_thread does
            settle(functools.partial(future.set_exception, error))
        else:
            settle(functools.partial(future.set_result, value))

    threading.Thread(target=work, name="heron-tool", daemon=True).start()
    return await future


@overload
def tool(fn: ToolFn, *, name: str | None = None, writes: bool = False) -> Tool: ...


@overload
def tool(
    fn: None = None, *, name: str | None = None, writes: bool = False
) -> Callable[[ToolFn], Tool]: ...


def tool(
    fn: ToolFn | None = None, *, name: str | None = None, writes: bool = False
) -> Tool | Callable[[ToolFn], Tool]:
    """Decorator: `@tool`, `@tool(name="other")` or `@tool(writes=True)` (the tool changes the
    workspace, so it never runs beside another that does) turns a function into a `Tool`."""
    if fn is None:
        return lambda f: dataclasses.replace(Tool.from_function(f, name), writes=writes)
    return Tool.from_function(fn, name)


# ---- registry --------------------------------------------------------------------------------


class ToolRegistry:
    def __init__(self, tools: Sequence[Tool] = (), before_call: BeforeCall | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        self.before_call = before_call
        for t in tools:
            self.add(t)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def replace(self, tool: Tool) -> None:
        """Put `tool` in place of the registered tool of the same name."""
        if tool.name not in self._tools:
            raise ValueError(f"no tool named {tool.name!r} is registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    async def call(
        self, call: ToolCall, ctx: ToolContext, on_start: OnStart | None = None
    ) -> ToolResult:
        """Run one call. Every failure becomes an is_error result; cancellation propagates.
        `on_start` is told when the tool itself starts: a tool that writes waits first for the
        one before it (`ToolContext.write_lock`), and its time is its own run's."""
        token = CALL_ID.set(call.id)
        try:
            out = await self._run(call, ctx, on_start)
        except ToolError as error:
            out = ToolOutput(f"Error: {error}", True)
        except Exception as error:
            out = ToolOutput(f"Error: {call.name} failed: {type(error).__name__}: {error}", True)
        finally:
            CALL_ID.reset(token)
        text, whole = out.text, out.whole
        if ctx.redactor is not None:  # before the full text is saved to the workspace, too
            text = await scrubbed(ctx.redactor, text)
            whole = None if whole is None else await scrubbed(ctx.redactor, whole)
        result = ToolResult(call.id, fit_budget(call.id, text, ctx), out.is_error)
        if whole is None and result.content != text:
            whole = text  # cut here: the person's /show still prints all of it
        home = ctx.services.home
        if whole is not None and home is not None:
            await asyncio.to_thread(keep_whole, home, result, whole)
        return result

    async def call_recording(
        self, call: ToolCall, ctx: ToolContext, on_start: OnStart | None = None
    ) -> tuple[ToolResult, list[JSONObject]]:
        """Run one call and return the side effects it recorded, and only its own."""
        return await recording(self.call(call, ctx, on_start))

    async def _run(self, call: ToolCall, ctx: ToolContext, on_start: OnStart | None) -> ToolOutput:
        found = self._tools.get(call.name)
        if found is None:
            available = ", ".join(self._tools) or "none"
            return ToolOutput(
                f"Error: unknown tool {call.name!r}. Available tools: {available}.", True
            )
        kwargs, problem = _validate(found, call.args)
        if problem is not None:
            return ToolOutput(problem, True)
        if self.before_call is not None:
            reason = self.before_call(call, ctx)
            if inspect.isawaitable(reason):
                reason = await reason
            if reason:
                return ToolOutput(f"Error: the call was refused: {reason}", True)
        if not found.writes:
            return await _started(found, ctx, kwargs, on_start)
        async with ctx.write_lock:
            return await _started(found, ctx, kwargs, on_start)


async def _started(
    found: Tool, ctx: ToolContext, kwargs: Mapping[str, object], on_start: OnStart | None
) -> ToolOutput:
    if on_start is not None:
        on_start()
    return _as_text(await found.run(ctx, kwargs))


def _validate(found: Tool, args: JSONObject) -> tuple[dict[str, object], str | None]:
    """The keyword arguments, or what is wrong with them said so the model can fix it."""
    if isinstance(args, dict) and set(args) == {"_raw"}:
        sent = str(args["_raw"])[:200]
        return {}, (
            f"Error: the arguments for {found.name} were not valid JSON: {sent!r}. "
            "Send one JSON object matching the tool's parameters."
        )
    if not isinstance(args, dict):
        return {}, f"Error: the arguments for {found.name} must be a JSON object."
    from pydantic import ValidationError

    try:
        # dict(), not model_dump(): values keep the types the hints asked for.
        return dict(found.args_model.model_validate(args)), None
    except ValidationError as error:
        problems = "; ".join(_describe(e) for e in error.errors())
        return {}, f"Error: invalid arguments for {found.name}: {problems}. {_signature(found)}"


def _describe(error: ErrorDetails) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    if error["type"] == "extra_forbidden":
        return f"{where!r} is not a parameter"
    if error["type"] == "missing":
        return f"{where!r} is required"
    return f"{where!r}: {error['msg']}"


def _signature(found: Tool) -> str:
    props = found.parameters.get("properties")
    listed = found.parameters.get("required")
    required = set(listed) if isinstance(listed, list) else set()
    parts = [
        f"{name} ({_type_of(spec)}{', required' if name in required else ''})"
        for name, spec in (props.items() if isinstance(props, Mapping) else ())
    ]
    return f"Parameters: {', '.join(parts) or 'none'}."


def _type_of(spec: JSONValue) -> str:
    found = spec.get("type") if isinstance(spec, Mapping) else None
    return str(found) if found is not None else "any"


def _as_text(value: object) -> ToolOutput:
    if isinstance(value, ToolOutput):
        return value
    if isinstance(value, str):
        return ToolOutput(value)
    if value is None:
        return ToolOutput("Done.")
    return ToolOutput(json.dumps(value, ensure_ascii=False, default=str, indent=1))


SCRUB_INLINE = 64_000  # characters: scrubbing more takes milliseconds (bench/redact.py)


async def scrubbed(redactor: Redactor, text: str) -> str:
    """`text` scrubbed of secrets; a long one on a worker thread, off the event loop."""
    if len(text) <= SCRUB_INLINE:
        return redactor.clean(text)
    return await asyncio.to_thread(redactor.clean, text)


# ---- per-result budget -----------------------------------------------------------------------


def fit_budget(call_id: str, text: str, ctx: ToolContext) -> str:
    """`text` if it fits the budget; otherwise its head and its end (where a tool says how it
    ended) around where the whole of it was saved."""
    cut = cut_middle(text, ctx.result_budget)
    if cut is None:
        return text
    where = keep(call_id, text, ctx.workspace)
    if where is None:
        return text  # nowhere to save it: better too long than lost
    return cut.text(f" The full result is saved in {where}; {READ_ON}.")
