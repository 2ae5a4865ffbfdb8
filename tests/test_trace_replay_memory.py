"""A run that used memory tools: `trace replay --live-tools` reported a difference for every
one ("Error: memory is not available in this run") and exited 1, and `trace export` gave a
`manage_memory` that wrote an entry no effect (QA22x L6). Memory tools are served from the
record, with a note saying so (they read and write memory's files and review queue, which a
replay leaves alone), and a memory change is an effect of its call."""

from __future__ import annotations

import json
from pathlib import Path

from heron.agent.engine import Engine
from heron.agent.replay import replay
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, Usage
from heron.proactive.wiring import replay_registry
from heron.providers.scripted import ScriptedProvider
from heron.trace.render import export_run
from heron.trace.scrub import Scrubber

SAID = "I live in Porto."


async def test_memory_tools_are_served_from_the_record_in_a_live_replay(tmp_path: Path) -> None:
    calls = [
        ToolCall(
            "m1",
            "manage_memory",
            {"action": "create", "path": "personal/always/city", "quote": SAID},
        ),
        ToolCall("m2", "view_memory", {"path": "personal/always/city"}),
    ]
    provider = ScriptedProvider(
        [Reply(calls, "tool", Usage(10, 1)), Reply([Text("Noted.")], "done", Usage(12, 1))]
    )
    async with Engine.open(Settings.load(), provider=provider) as engine:
        result = await engine.turn("mem", SAID)
        exported = json.loads(export_run(engine.store, result.run_id, Scrubber()))
        report = await replay(
            engine.store,
            result.run_id,
            registry=replay_registry(),
            live_tools=True,
            workspace=tmp_path,
        )
    saved = next(t for t in exported["tool_calls"] if t["call_id"] == "m1")
    assert not saved["is_error"], saved["result"]
    assert saved["effects"] == [{"kind": "memory_saved", "path": "personal/always/city.md"}]
    assert report.tool_differences == [], report.render()
    assert report.identical, report.render()
    (note,) = [n for n in report.notes if "memory" in n]
    assert "manage_memory, view_memory" in note and "served from the record" in note
