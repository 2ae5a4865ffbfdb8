"""Effects belong to their call: three different tools in one reply, each call's trace row and
result naming only what it did itself."""

from __future__ import annotations

import json

import pytest

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider

pytestmark = pytest.mark.slow  # a real kernel


async def test_each_call_of_one_reply_records_only_its_own_effects(heron_home):
    calls = [
        ToolCall("c1", "run_cell", {"code": "open('from_kernel.txt', 'w').write('k')"}),
        ToolCall("c2", "bash", {"command": "echo b > from_bash.txt"}),
        ToolCall("c3", "write_file", {"path": "from_tool.txt", "content": "w"}),
    ]
    provider = ScriptedProvider([Reply(calls, "tool"), Reply([Text("done")], "done")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("fx", "write three files")
        rows = engine.store.query("SELECT call_id, effects, result FROM tool_calls ORDER BY id")
    assert result.ok
    by_call = {row[0]: (json.loads(row[1] or "[]"), row[2] or "") for row in rows}
    kernel_effects, kernel_result = by_call["c1"]
    assert kernel_effects == [{"kind": "file_written", "path": "from_kernel.txt"}]
    assert "from_bash.txt" not in kernel_result and "from_tool.txt" not in kernel_result
    assert "from_kernel.txt (new)" in kernel_result
    assert [e["kind"] for e in by_call["c2"][0]] == ["command"]
    assert by_call["c2"][0][0]["command"] == "echo b > from_bash.txt"
    assert by_call["c3"][0] == [{"kind": "file_written", "path": "from_tool.txt"}]
