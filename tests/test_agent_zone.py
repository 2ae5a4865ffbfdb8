"""Every time Heron shows is in the agent's zone (heron/timefmt.py, docs/proactive.md "Times").

The home says `[agent] timezone = "Pacific/Kiritimati"` (UTC+14) while the process runs in UTC:
at 12:30 UTC on 5 December it is already 02:30 on the 6th there, so a time read in the
process's zone shows the wrong hour and the wrong day. Each command lists the same instant as
`heron jobs list` reads its schedule: in Kiritimati.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from heron import timefmt
from heron.agent.engine import Engine
from heron.channels.inprocess import connect
from heron.cli import app
from heron.config import Settings
from heron.memory.entries import EntryPath, _stamp, _unstamp
from heron.memory.section import HistoryEntry, recent_history_section
from heron.memory.service import MemoryService
from heron.messages import Message, Reply, Text, ToolCall, Usage
from heron.providers.scripted import ScriptedProvider
from heron.serve import api
from heron.store import Store, compactions, jobs, runs
from heron.tools.memory_tools import recall_history
from heron.tools.registry import ToolRegistry
from heron.tools.schedule import status_lines

ZONE = "Pacific/Kiritimati"
AT = dt.datetime(2026, 12, 5, 12, 30, tzinfo=dt.UTC).timestamp()
THERE = "2026-12-06 02:30"  # AT in Kiritimati: what every command must show
HERE = "2026-12-05 12:30"  # AT in the process's zone (UTC): what none may show

runner = CliRunner()


@pytest.fixture
def kiritimati(heron_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (heron_home / "config.toml").write_text(f'[agent]\ntimezone = "{ZONE}"\n')
    old = os.environ.get("TZ")
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield heron_home
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


def _pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversation `zone` written at AT: a turn whose message names a flamingo, a question
    that waits until AT, a consolidation, and a memory entry committed at AT."""
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: AT)
        m.setenv("GIT_AUTHOR_DATE", f"@{int(AT)} +0000")
        m.setenv("GIT_COMMITTER_DATE", f"@{int(AT)} +0000")
        settings = Settings.load()
        store = Store(settings.database)
        try:
            conv = store.open_conversation("zone")
            said = Message("user", [Text("I saw a flamingo, remember that I love flamingos")])
            turn, _ = store.begin_turn(conv.id, "run-zone", said, model="scripted")
            store.append(conv.id, Message("assistant", [Text("Lovely.")]), turn_id=turn)
            store.finish_turn(
                turn,
                status="done",
                stop_reason="done",
                usage=Usage(5, 2),
                model_calls=1,
                tool_calls=0,
            )
            runs.create(store, "ask_z", "ask", "zone", "Which bird?", status="waiting")
            with store.transaction() as c:  # its deadline: AT too
                c.execute("UPDATE runs SET deadline = ? WHERE id = 'ask_z'", (AT,))
            compactions.add_compaction(
                store, conv.id, kind="consolidation", reason="test", summary="flamingo talk"
            )
            service = MemoryService(settings.paths.ensure().memory, store)
            service.save(conv.id, EntryPath.parse("user/always/birds.md"), "I love flamingos")
        finally:
            store.close()


def _out(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _agrees(text: str, there: str = THERE, here: str = HERE) -> None:
    assert there in text, text
    assert here not in text, text


def test_every_command_shows_the_agents_zone_as_jobs_list_does(kiritimati, monkeypatch):
    _pinned(monkeypatch)
    # The reference: a job's time is read and listed in [agent] timezone.
    _out("jobs", "add", "Feed the flamingos.", "-c", "zone", "--at", "2031-12-06 02:30")
    _agrees(_out("jobs", "list"), "2031-12-06 02:30", "2031-12-05 12:30")

    _agrees(_out("conversations", "list"))
    _agrees(_out("trace", "ls"))
    _agrees(_out("trace", "show", "run-zone"), f"{THERE}:00 +14")
    _agrees(_out("runs", "list"))
    _agrees(_out("runs", "show", "ask_z"), f"{THERE} +14")
    _agrees(_out("memory", "log"))
    explained = _out("memory", "explain", "user/always/birds.md")
    _agrees(explained, f"{THERE} +14")
    assert f"said:         {THERE} +14" in explained  # when the quote's message was typed
    _agrees(_out("conversations", "show", "zone", "--compactions"))
    # usage: the day is Kiritimati's, the 6th, not UTC's 5th
    _agrees(_out("usage", "--days", "0"), "2026-12-06", "2026-12-05")
    exported = _out("conversations", "export", "zone")
    _agrees(exported, f"{THERE}:00")
    assert f"started {THERE}:00 +14" in exported and f"Times are in {ZONE}" in exported
    # recall hits, as the person reads them and as --json dates them
    _agrees(_out("memory", "recall", "flamingo"))
    _agrees(_out("conversations", "search", "flamingo"))
    (hit, *_) = json.loads(_out("conversations", "search", "flamingo", "--json"))
    assert hit["date"] == "2026-12-06T02:30:00+1400"


def test_the_model_reads_recall_hits_and_recent_history_in_the_agents_zone(kiritimati, monkeypatch):
    """What the model reads: auto-recall's hits and recall_history's (both `Hit.line`), and
    the Recent History section of the system prompt (another conversation's consolidation)."""
    _pinned(monkeypatch)
    call = ToolCall("r1", "recall_history", {"query": "flamingo"})
    provider = ScriptedProvider(
        [Reply([call], "tool", Usage(5, 2)), Reply([Text("You love them.")], "done", Usage(5, 2))]
    )

    async def ask() -> None:
        settings = Settings.load()
        registry = ToolRegistry([recall_history])
        async with Engine.open(settings, provider=provider, registry=registry) as eng:

            async def deliver(item: object) -> None:
                pass

            async with connect(eng, "terminal", "t", deliver) as agent:
                await agent.send("what about the flamingo I saw?", "ask")
                await agent.settle()

    asyncio.run(ask())
    first, second = provider.requests
    assert f"- [{THERE}] zone: flamingo talk" in first.system
    result = second.messages[-1].tool_results[0].content
    assert f"[zone · {THERE} · message" in result
    assert HERE not in first.system and HERE not in result


def test_status_says_the_heartbeat_and_a_questions_deadline_in_the_agents_zone(kiritimati):
    store = Store(Settings.load().database)
    try:
        runs.create(store, "ask_s", "ask", "s", "Which bird?", status="waiting")
        with store.transaction() as c:
            later = AT + 5 * 365 * 86400  # still ahead: the line shows a question waiting
            c.execute("UPDATE runs SET deadline = ? WHERE id = 'ask_s'", (later,))
        jobs.claim_tick(store, "heartbeat", "me", AT, 60)  # the first: it starts the count
        jobs.end_tick(store, "heartbeat", "ok")
        lines = "\n".join(
            runs.status_lines(store, "s", AT - 60, ZONE) + status_lines(store, "s", ZONE)
        )
    finally:
        store.close()
    assert "until 02:30" in lines and "12:30" not in lines, lines
    assert f"heartbeat: last {THERE} ok" in lines, lines


def test_the_browser_list_dates_an_old_conversation_in_the_agents_zone(kiritimati, monkeypatch):
    _pinned(monkeypatch)
    web = FastAPI()
    api.install(web, Settings.load())
    (row,) = TestClient(web).get("/api/conversations").json()["conversations"]
    assert (row["key"], row["day"]) == ("zone", "2026-12-06")


def test_recent_history_and_timefmt_name_the_zone_only_when_asked():
    entry = HistoryEntry(AT, "zone: flamingo talk")
    assert f"[{THERE}]" in recent_history_section([entry], zone=ZONE)
    assert timefmt.when(AT, ZONE) == THERE
    assert timefmt.when(AT, "Europe/Berlin", named=True) == "2026-12-05 13:30 CET"


def test_a_memory_stamp_with_its_offset_is_that_instant_in_any_process_zone(kiritimati):
    """A file written by a process in another zone (its stamp's offset +1400) is read back as
    the instant it names; `time.mktime` read it in local time, fourteen hours off."""
    assert _unstamp("2026-12-06T02:30:00+1400") == AT
    assert _unstamp(_stamp(AT)) == AT


def test_a_job_made_in_another_zone_is_told_in_the_agents_zone_everywhere(kiritimati):
    """`Created/Paused/Resumed job ...`, /status and the browser's work panel showed a job's
    time in the zone it was made in (named) while `heron jobs list` shows the agent's."""
    from heron.serve import work
    from heron.store.schedule import parse

    store = Store(Settings.load().database)
    try:  # made while the agent's zone was UTC: its instant is 02:30 on the 6th in Kiritimati
        made = parse(at="2031-12-05 12:30", timezone="UTC")
        job = jobs.create_job(store, made, conversation="zone", prompt="Feed them.", now=AT)
        status = "\n".join(status_lines(store, "zone", ZONE))
        panel = work.work_event(store, "zone", ZONE)["jobs"][0]
    finally:
        store.close()
    # Its schedule reads as `heron jobs list` has it ("once at 2031-12-05 12:30 (UTC)": the
    # zone it fires by, named); the times it fires next are the agent's.
    there, here = "next 2031-12-06 02:30 +14", "next 2031-12-05 12:30"
    _agrees(status, there, here)
    _agrees(panel["line"], there, here)
    assert panel["next_local"] == "2031-12-06 02:30 +14"
    _out("jobs", "pause", str(job.id))
    _agrees(_out("jobs", "resume", str(job.id)), "next Sat 2031-12-06 02:30 +14", "12:30 UTC")
    _agrees(_out("jobs", "pause", str(job.id)), "paused", here)
    _agrees(_out("jobs", "pause", str(job.id)), "already paused", here)
