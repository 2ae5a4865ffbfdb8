"""A model offered no tools (the offline demo model, a GGUF whose template names none), asked
to use one, wrote a made-up shell command and Heron said nothing (QA22u L6): the person is now
told once, as a notice, that it cannot."""

from __future__ import annotations

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.agent.turn import asks_for_tools
from heron.bus import InboundMessage, MessageBus, OutboundMessage
from heron.config import Settings
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.tools.registry import ToolRegistry


async def _notices(registry: ToolRegistry | None, *texts: str) -> list[list[str]]:
    """The notices each message's turn was told, in order, on one conversation."""
    bus = MessageBus()
    provider = ScriptedProvider(lambda request: Reply([Text('bash -c "ls"')], "done"))
    said: list[list[str]] = []
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        for text in texts:
            await loop.dispatch(InboundMessage("terminal", "1", text, "k", events=True))
            await loop.wait_idle()
            out = [bus.outbound.get_nowait() for _ in range(bus.outbound.qsize())]
            said.append(
                [o.text for o in out if isinstance(o, OutboundMessage) and o.kind == "notice"]
            )
    return said


ASK = "list the files in my workspace using your bash tool"


async def test_a_model_with_no_tools_asked_for_one_is_said_to_have_none_once():
    first, again, other = await _notices(ToolRegistry([]), ASK, "run the command ls", "hi")
    assert len(first) == 1
    assert "cannot use tools" in first[0] and "only text" in first[0]
    assert again == [] and other == []  # once per conversation


async def test_a_model_with_tools_or_a_message_about_none_gets_no_note():
    (with_tools,) = await _notices(None, ASK)
    assert with_tools == []
    (plain,) = await _notices(ToolRegistry([]), "What is the capital of France?")
    assert plain == []


def test_which_messages_ask_for_tools():
    for text in (ASK, "Run `ls` in the shell", "read the file notes.md", "use run_cell"):
        assert asks_for_tools(text), text
    for text in ("hello", "What is the capital of France?", "Tell me a story about a fox"):
        assert not asks_for_tools(text), text
