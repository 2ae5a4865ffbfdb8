"""What a turn hands its tools: typed `ToolContext` fields (`services`), not a bag of string keys.

A tool run by a real turn finds the turn's store, conversation, agent, running turn, timezone
and home on `ctx.services`, the channel's approver on `ctx.approve`, and which reply asked on
`ctx.reply_seq`; a bare context (a test, a replay) has every service None, and the tools that
need one say so to the model."""

from __future__ import annotations

import dataclasses

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider
from heron.tools.context import ToolContext, TurnServices
from heron.tools.message import message
from heron.tools.registry import ToolRegistry, tool
from heron.tools.schedule import schedule
from heron.tools.work_state import work_state


async def test_a_turn_hands_its_tools_typed_services():
    seen: list[ToolContext] = []
    replies: list[int] = []

    @tool
    async def look(ctx: ToolContext) -> str:
        """Look at what the run was given."""
        seen.append(ctx)
        replies.append(ctx.reply_seq)
        return "looked"

    async def approve(name: str, command: str, confined: bool) -> str | None:
        return None

    script = [
        Reply([ToolCall("c1", "look", {})], "tool"),
        Reply([ToolCall("c2", "look", {})], "tool"),
        Reply([Text("done")], "done"),
    ]
    settings = Settings.load()
    async with Engine.open(
        settings, provider=ScriptedProvider(script), registry=ToolRegistry([look])
    ) as engine:
        engine.approve = approve
        await engine.turn("k", "look twice")
        conversation = engine.store.conversation("k")
    first, second = seen
    assert first is second  # one context per run
    services = first.services
    assert services.store is engine.store
    assert conversation is not None and services.conversation_id == conversation.id
    assert (services.conversation_key, services.agent) == ("k", "default")
    assert services.turn is not None and services.turn.provenance == "user"
    assert not services.turn.stale
    assert services.home == settings.paths.home
    assert services.memory is engine.memory and services.recall is engine.recall
    assert first.approve is approve
    assert replies == [1, 2]
    assert not hasattr(first, "extra")  # the old bag of string keys is gone
    assert {f.name for f in dataclasses.fields(TurnServices)} >= {"subagents", "asks"}


async def test_tools_without_their_service_tell_the_model(tmp_path):
    ctx = ToolContext(tmp_path)
    registry = ToolRegistry([message, schedule, work_state])
    said = [
        await registry.call(ToolCall("a", "message", {"text": "hi"}), ctx),
        await registry.call(ToolCall("b", "schedule", {"action": "list"}), ctx),
        await registry.call(ToolCall("c", "work_state", {}), ctx),
    ]
    assert all(r.is_error for r in said)
    assert "No channel to deliver to" in said[0].content
    assert "needs a stored conversation" in said[1].content
    assert "work state is not available" in said[2].content
