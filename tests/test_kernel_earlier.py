"""Whether a conversation's model saw cells of an earlier kernel (`Store.used_tool`): what a
new kernel's first cell asks before telling the model its variables are gone (docs/engine.md,
"The Python kernel"). On SQLite and PostgreSQL; the tool here only records a call by its name,
no kernel runs."""

from __future__ import annotations

import pytest

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.tools.context import ToolContext
from heron.tools.registry import Tool, ToolRegistry, tool

pytestmark = pytest.mark.usefixtures("home_db")


@tool(name="run_cell")
async def recorded_cell(ctx: ToolContext, code: str) -> str:
    """Stands in for run_cell: only its call is on record."""
    return "ran"


def one_call(name: str) -> list[Reply]:
    return [
        Reply([ToolCall("c1", name, {"code": "x = 1"})], "tool", Usage(1, 1)),
        Reply([Text("done")], "done", Usage(1, 1)),
    ]


async def test_a_cell_is_on_record_until_new() -> None:
    provider = ScriptedProvider(
        [*one_call("other_tool"), *one_call("run_cell"), Reply([Text("ok")], "done", Usage(1, 1))]
    )
    registry = ToolRegistry([recorded_cell, other_tool("other_tool")])
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        store = engine.store
        await engine.turn("e", "no cell yet")
        conversation = store.conversation("e")
        assert conversation is not None
        before = store.used_tool(conversation.id, "run_cell")
        await engine.turn("e", "a cell")
        after = store.used_tool(conversation.id, "run_cell")
        await engine.turn("e", "/new")
        since_new = store.used_tool(conversation.id, "run_cell")
    assert (before, after, since_new) == (False, True, False)


def other_tool(name: str) -> Tool:
    """Another tool, so a call that is not run_cell is on record too."""

    async def other(ctx: ToolContext, code: str) -> str:
        """Does nothing."""
        return "other"

    return tool(other, name=name)
