from __future__ import annotations

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider


async def test_turn_persists_everything_and_second_turn_sees_first():
    provider = ScriptedProvider(
        [
            Reply([ToolCall("c1", "run_cell", {"code": "x = 41 + 1"})], "tool", Usage(100, 10)),
            Reply([Text("x is set.")], "done", Usage(120, 5, cache_read=100)),
            Reply([Text("x was 42.")], "done", Usage(150, 5, cache_read=120)),
        ]
    )
    settings = Settings.load()
    async with Engine.open(settings, provider=provider) as engine:
        first = await engine.turn("t1", "set x to 42 with python")
        second = await engine.turn("t1", "what was x?")
        store = engine.store
        conv = store.conversation("t1")
        turns = store.turns(conv.id)
        calls = store.query("SELECT name, args, result FROM tool_calls")
        model_calls = store.query("SELECT COUNT(*) FROM model_calls")[0][0]
    assert first.text == "x is set." and second.text == "x was 42."
    # The second request carries the whole first exchange, tool call and result included.
    sent = provider.requests[2].messages
    assert [m.role for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert sent[1].tool_calls[0].args == {"code": "x = 41 + 1"}
    assert sent[-1].parts[0].text == "what was x?"  # then the runtime block
    assert [t.status for t in turns] == ["done", "done"]
    assert turns[0].usage == Usage(220, 15, 100, 0) and turns[0].model_calls == 2
    assert calls[0]["name"] == "run_cell" and "x = 41 + 1" in calls[0]["args"]
    assert model_calls == 3
    provider.assert_complete()


async def test_failed_turn_keeps_the_users_message():
    from heron.errors import AuthError

    provider = ScriptedProvider([AuthError("401 bad key", hint="Set ANTHROPIC_API_KEY")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("k", "please remember this")
        conv = engine.store.conversation("k")
        rows = engine.store.branch(conv.id)
        turn = engine.store.turns(conv.id)[0]
    assert not result.ok and "ANTHROPIC_API_KEY" in str(result.run.error)
    assert [r.message.text for r in rows] == ["please remember this"]
    assert turn.status == "failed" and "401" in turn.error
