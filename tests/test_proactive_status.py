"""Item 8 of issue 16: /status shows the conversation's jobs and the heartbeat; the system
prompt's recurring-work section names the real tool only when the turn has it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from serve_helpers import running_serve, ws_client, ws_hello, ws_until

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import MessageBus
from heron.config import Settings
from heron.context.prompt import PromptInputs, build_system_prompt
from heron.messages import Reply, Text, Usage
from heron.proactive.ask import attach as attach_ask
from heron.proactive.goals import attach as attach_goals
from heron.proactive.subagents import attach as attach_subagents
from heron.providers.scripted import ScriptedProvider
from heron.store import Store, goals, runs
from heron.store import jobs as js
from heron.store.schedule import parse
from heron.tools.registry import ToolRegistry


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
        js.claim_tick(store, "heartbeat", "me", 300.0, 60.0)
        js.end_tick(store, "heartbeat", "failed", "connection refused\nIs the server running?")
        failed = (await engine.turn("s", "/status")).reply.splitlines()
    at = status.index("jobs: 1 here, 1 in other conversations")
    assert status[at + 1].startswith(f"  job {mine.id} [reminder, active] cron 0 9 * * 1-5")
    assert status[at + 1].endswith("Stand-up notes.")
    assert status[-1].startswith("heartbeat: last ") and status[-1].endswith(
        "skipped (HEARTBEAT.md has nothing to check)"
    )
    # A failure's error and hint on its one line (qa24c L2).
    assert failed[-1].endswith("failed (connection refused. Is the server running?)")


def _section(prompt: str) -> str:
    return prompt.split("# Recurring work\n", 1)[1].split("\n\n", 1)[0]


async def test_recurring_work_names_only_tools_the_turn_has_and_each_real_one():
    async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
        loop = AgentLoop(engine, MessageBus())
        manager = attach_subagents(loop)
        attach_ask(loop)
        attach_goals(loop)
        try:
            specs = engine.registry.specs()
            prompt = build_system_prompt(engine.prompt_inputs("default"))
        finally:
            await manager.close()
            await loop.close()
    registered = {spec.name for spec in specs}
    named = re.findall(r"`(\w+)`", _section(prompt))
    assert named == ["schedule", "spawn", "goal", "ask_user", "message"]  # the real tools
    assert set(named) <= registered
    assert 'mode="monitor"' in prompt and "HEARTBEAT.md" in prompt
    # A subagent's turn has no spawn, goal or ask_user: the section names none of them.
    subset = [spec for spec in specs if spec.name not in ("spawn", "goal", "ask_user")]
    sub = _section(build_system_prompt(PromptInputs("a", Path("."), subset)))
    assert re.findall(r"`(\w+)`", sub) == ["schedule", "message"]
    only_message = [spec for spec in specs if spec.name == "message"]
    for tools in (only_message, [], None):
        assert "# Recurring work" not in build_system_prompt(PromptInputs("a", Path("."), tools))


def _work(store) -> float:
    """A goal, subagents and a question in conversation "s" (and work elsewhere); returns the
    instant the first subagent started."""
    goals.set_goal(store, "s", "Migrate the blog to the new host\nthen tell me.")
    goal = goals.open_goal(store, "s")
    goals.count_turn(store, goal.id, 12_000)
    started = runs.create(
        store, "sa_1", "subagent", "s", "Summarise the logs\nin detail", status="running"
    ).created
    runs.create(store, "sa_2", "subagent", "s", "Count the files", status="running")
    runs.finish(store, "sa_2", "done", "42 files")  # done, not reported back yet
    runs.create(store, "sa_3", "subagent", "s", "Old work", status="running")
    runs.finish(store, "sa_3", "done", "x")
    runs.mark_announced(store, "sa_3")  # reported: no longer shown
    runs.create(store, "sa_9", "subagent", "other", "Elsewhere", status="running")
    runs.create(store, "ask_1", "ask", "s", "Which city?", status="waiting")
    return started


def test_status_lines_name_the_goal_its_budget_and_the_running_subagents(heron_home):
    store = Store(Settings.load().paths.ensure().db)
    try:
        started = _work(store)
        lines = runs.status_lines(store, "s", started + 125, "UTC")
    finally:
        store.close()
    assert lines[0] == (
        "goal: active, 1 of 20 turns, 12,000 of 2,000,000 tokens: Migrate the blog to the new host"
    )
    assert lines[1] == "subagent sa_1: running, 2m 05s: Summarise the logs"
    assert lines[2].startswith("subagent sa_2: done, not reported back, ")
    assert lines[2].endswith(": Count the files")
    assert lines[3].startswith("question ask_1: waiting for your answer, asked ")
    assert len(lines) == 4  # sa_3 reported back, sa_9 belongs to another conversation


async def test_status_shows_the_goal_and_subagents_in_the_terminal_and_through_serve():
    provider = ScriptedProvider([])
    async with Engine.open(Settings.load(), provider=provider, registry=ToolRegistry([])) as engine:
        quiet = (await engine.turn("s", "/status")).reply
        _work(engine.store)
        terminal = (await engine.turn("s", "/status")).reply
    assert "goal:" not in quiet and "subagent" not in quiet
    assert "goal: active, 1 of 20 turns" in terminal
    assert re.search(r"^subagent sa_1: running, \d+s: Summarise the logs$", terminal, re.M)
    # The serve announces sa_2's result when it starts (a turn of its own; sa_1 still runs,
    # so the goal waits for it and no nudge follows); /status then has sa_1 left.
    announced = ScriptedProvider([Reply([Text("Noted: 42 files.")], "done", Usage(10, 2))])
    async with running_serve(announced) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "s")
        announce = await ws_until(ws, "turn_end")
        await ws.send(json.dumps({"type": "command", "text": "/status"}))
        events = await ws_until(ws, "turn_end")
    assert announce[-1]["reply"] == "Noted: 42 files."
    (reply,) = [e["text"] for e in events if e["type"] == "message" and e["kind"] == "command"]
    assert "goal: active, 1 of 20 turns" in reply
    assert re.search(r"^subagent sa_1: running, ", reply, re.M) and "sa_2" not in reply


async def test_status_says_every_time_in_the_agents_zone(heron_home):
    """The heartbeat's last tick in the agent's zone, which the nightly review's next time is
    in too, not the system's (QA18g: three zones in one /status)."""
    import datetime as dt
    from zoneinfo import ZoneInfo

    (heron_home / "config.toml").write_text('[agent]\ntimezone = "Asia/Tokyo"\n')
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider([]), registry=ToolRegistry([])
    ) as engine:
        store = engine.store
        tokyo = parse(cron="45 13 * * *", timezone="Asia/Tokyo")
        js.sync_review(store, tokyo, True, 0.0, "review")
        beat = dt.datetime(2026, 12, 5, 12, 29, tzinfo=dt.UTC).timestamp()
        js.claim_tick(store, "heartbeat", "me", beat, 60.0)
        js.end_tick(store, "heartbeat", "checked")
        status = (await engine.turn("s", "/status")).reply.splitlines()
    shown = dt.datetime.fromtimestamp(beat, ZoneInfo("Asia/Tokyo"))
    assert f"heartbeat: last {shown:%Y-%m-%d %H:%M} checked" in status
