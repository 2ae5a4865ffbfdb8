from __future__ import annotations

import pytest

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider
from heron.store import Store, work
from heron.tools.context import ToolContext, TurnServices
from heron.tools.scratchpad import scratchpad
from heron.tools.todos import todos
from heron.tools.work_state import work_state


@pytest.fixture
def ctx(tmp_path):
    store = Store(tmp_path / "h.db")
    conv = store.open_conversation("k")
    yield ToolContext(tmp_path / "ws", services=TurnServices(store, conv.id))
    store.close()


async def test_work_state_updates_fields_and_clears(ctx):
    await work_state(ctx, goal="ship v2", next_step="write tests")
    shown = await work_state(ctx, decisions=["use sqlite"])
    assert '"goal": "ship v2"' in shown and "use sqlite" in shown and "write tests" in shown
    assert await work_state(ctx, clear=True) == "No work state."
    assert work.work_state(ctx.services.store, ctx.services.conversation_id) == {}


async def test_todos_need_evidence_to_be_done(ctx):
    from heron.errors import ToolError

    listed = await todos(ctx, add=["write the parser", "run the suite"])
    assert "#1 [pending] (medium) write the parser" in listed
    with pytest.raises(ToolError, match="verified_by"):
        await todos(ctx, item=1, status="done")
    done = await todos(ctx, item=1, status="done", verified_by="pytest: 12 passed")
    assert "#1 [done] (medium) write the parser — verified by: pytest: 12 passed" in done


async def test_scratchpad_refuses_writes_over_its_bounds(ctx, tmp_path):
    from heron.errors import ToolError

    ctx.scratchpad = tmp_path / "pad"
    ctx.scratchpad_limits = (100, 2, 150)
    await scratchpad(ctx, "write", "a.md", "x" * 90)
    with pytest.raises(ToolError, match="holds 100"):
        await scratchpad(ctx, "append", "a.md", "y" * 20)
    await scratchpad(ctx, "write", "b.md", "z" * 50)
    with pytest.raises(ToolError, match="2 files"):
        await scratchpad(ctx, "write", "c.md", "1")
    with pytest.raises(ToolError, match="exceed 150"):
        await scratchpad(ctx, "write", "b.md", "z" * 70)
    with pytest.raises(ToolError, match="inside the scratchpad"):
        await scratchpad(ctx, "write", "../escape.md", "1")
    assert (tmp_path / "pad/a.md").read_text() == "x" * 90  # nothing dropped
    assert await scratchpad(ctx, "list") == "a.md\nb.md"


async def test_the_engine_gives_the_tools_their_conversation():
    provider = ScriptedProvider(
        [
            Reply([ToolCall("t1", "todos", {"add": ["check the logs"]})], "tool"),
            Reply([Text("noted")], "done"),
        ]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("k", "remind me to check the logs")
        conv = engine.store.conversation("k")
        items = work.todos(engine.store, conv.id)
    assert [t.text for t in items] == ["check the logs"]
    assert "#1 [pending]" in provider.requests[1].messages[-1].tool_results[0].content
