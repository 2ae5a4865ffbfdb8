"""Item 8 of issue 16: /status shows the conversation's jobs and the heartbeat; the system
prompt's recurring-work section names the real tool only when the turn has it."""

from __future__ import annotations

from heron.agent.engine import Engine
from heron.config import Settings
from heron.context.prompt import PromptInputs, build_system_prompt
from heron.providers.scripted import ScriptedProvider
from heron.store import jobs as js
from heron.store.schedule import parse
from heron.tools.registry import ToolRegistry
from heron.tools.schedule import schedule


async def test_status_lists_the_jobs_of_this_conversation_and_the_heartbeat():
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider([]), registry=ToolRegistry([])
    ) as engine:
        store = engine.store
        quiet = await engine.turn("s", "/status")
        assert "jobs:" not in quiet.reply and "heartbeat:" not in quiet.reply
        when = parse(cron="0 9 * * 1-5", timezone="Europe/Berlin")
        mine = js.create_job(store, when, conversation="s", prompt="Stand-up notes.", now=0.0)
        js.create_job(store, when, conversation="other", prompt="Elsewhere.", now=0.0)
        js.claim_tick(store, "heartbeat", "me", 100.0, 60.0)
        js.claim_tick(store, "heartbeat", "me", 200.0, 60.0)
        js.end_tick(store, "heartbeat", "skipped", "HEARTBEAT.md has nothing to check")
        status = (await engine.turn("s", "/status")).reply.splitlines()
    at = status.index("jobs: 1 here, 1 in other conversations")
    assert status[at + 1].startswith(f"  job {mine.id} [reminder, active] cron 0 9 * * 1-5")
    assert status[at + 1].endswith("Stand-up notes.")
    assert status[-1].startswith("heartbeat: last ") and status[-1].endswith(
        "skipped (HEARTBEAT.md has nothing to check)"
    )


def test_recurring_work_names_the_schedule_tool_and_heartbeat_only_when_the_turn_has_it(tmp_path):
    with_it = build_system_prompt(PromptInputs("a", tmp_path, ToolRegistry([schedule]).specs()))
    without = build_system_prompt(PromptInputs("a", tmp_path, []))
    section = with_it.split("# Recurring work\n", 1)[1].split("\n\n", 1)[0]
    assert (
        "`schedule` tool" in section and 'mode="monitor"' in section and "HEARTBEAT.md" in section
    )
    assert "# Recurring work" not in without
