"""The scheduler on a fake clock: cron instants across DST, missed runs, two schedulers on one
home, reminders that speak, monitors that stay silent, and scheduled turns that cannot make jobs."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from zoneinfo import ZoneInfo

import pytest
from schedule_helpers import answer, call, last_user_text, rig

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import InboundMessage, MessageBus
from heron.config import Settings
from heron.messages import Reply, ToolCall
from heron.proactive.clock import FakeClock
from heron.proactive.scheduler import Scheduler
from heron.providers.base import ChatRequest
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.store import jobs as js
from heron.store.schedule import ScheduleError, parse
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool
from heron.tools.schedule import MAX_AGENT_JOBS_HERE

BERLIN = ZoneInfo("Europe/Berlin")


def local(*args: int) -> float:
    return dt.datetime(*args, tzinfo=BERLIN).timestamp()


def make_job(store: Store, now: float, mode: str = "reminder", **schedule: str) -> js.Job:
    catch_up = schedule.pop("catch_up", "once")
    when = parse(timezone="Europe/Berlin", **schedule)
    return js.create_job(
        store,
        when,
        conversation="chat-1",
        prompt="Stand-up in five minutes.",
        now=now,
        mode=mode,
        catch_up=catch_up,
        created_by="test",
    )


def test_cron_instants_stay_at_local_time_across_both_dst_changes():
    daily = parse(cron="0 9 * * *", timezone="Europe/Berlin")
    t = local(2026, 3, 27, 12, 0)
    seen = []
    for _ in range(4):
        t = daily.next_after(t)
        seen.append(dt.datetime.fromtimestamp(t, BERLIN))
    assert [(d.day, d.hour, d.minute) for d in seen] == [
        (28, 9, 0),
        (29, 9, 0),
        (30, 9, 0),
        (31, 9, 0),
    ]
    assert [d.utcoffset() for d in seen] == [dt.timedelta(hours=h) for h in (1, 2, 2, 2)]
    # 02:30 does not exist on 29 March: it fires once, an hour later in wall time, and the next
    # day's 02:30 is back in place; in October 02:30 exists twice and fires once.
    night = parse(cron="30 2 * * *", timezone="Europe/Berlin")
    spring = [night.next_after(local(2026, 3, 28, 12, 0))]
    spring.append(night.next_after(spring[0]))
    assert [dt.datetime.fromtimestamp(s, dt.UTC).strftime("%d %H:%M") for s in spring] == [
        "29 01:30",
        "30 00:30",
    ]
    autumn = [night.next_after(local(2026, 10, 24, 12, 0))]
    autumn.append(night.next_after(autumn[0]))
    assert [dt.datetime.fromtimestamp(a, dt.UTC).strftime("%d %H:%M") for a in autumn] == [
        "25 00:30",
        "26 01:30",
    ]


def test_bad_schedules_say_what_works():
    for kwargs in ({"cron": "every day"}, {"every": "5s"}, {"at": "tomorrow"}, {}):
        with pytest.raises(ScheduleError) as caught:
            parse(timezone="Europe/Berlin", **kwargs)
        assert 'cron="0 9 * * 1-5"' in str(caught.value)
    with pytest.raises(ScheduleError, match="unknown timezone"):
        parse(every="1h", timezone="Mars/Olympus")
    store = Store(":memory:")
    with pytest.raises(ScheduleError, match="already past"):
        make_job(store, local(2026, 5, 1, 12, 0), at="2026-05-01 11:00")
    assert [j for j in js.list_jobs(store, everything=True) if not j.builtin] == []


async def test_a_cron_reminder_fires_at_its_instants_across_dst_and_speaks_visibly():
    def script(request: ChatRequest) -> object:
        assert "Stand-up in five minutes." in last_user_text(request)
        return answer("Reminder: stand-up in five minutes.")

    async with rig(script, local(2026, 3, 27, 12, 0)) as r:
        store = r.engine.store
        job = make_job(store, r.clock.now(), cron="0 9 * * *")
        r.scheduler.poke()
        await r.settle()
        instants = [local(2026, 3, 28, 9, 0), local(2026, 3, 29, 9, 0), local(2026, 3, 30, 9, 0)]
        await r.at(instants[0] - 1)
        assert r.messages == []  # not before its instant
        for instant in instants:
            await r.at(instant)
        done = list(reversed(js.runs(store, job.id)))
        assert [run.due for run in done] == instants
        assert [(run.status, run.outcome) for run in done] == [("done", "delivered")] * 3
        # The answer arrives visibly, in the conversation the job was bound to.
        assert [(m.kind, m.key, m.text) for m in r.messages] == [
            ("answer", "chat-1", "Reminder: stand-up in five minutes.")
        ] * 3
        rows = store.branch(store.conversation("chat-1").id)
        prompts = [row for row in rows if row.role == "user"]
        assert len(prompts) == 3 and all(row.author == "heron" for row in prompts)
        assert js.get_job(store, job.id).next_run == local(2026, 3, 31, 9, 0)


async def test_a_job_missed_while_serve_was_down_fires_once_on_start():
    start = local(2026, 6, 1, 8, 0)
    async with rig(lambda _: answer("Done."), start + 5 * 3600 + 60, run_scheduler=False) as r:
        store = r.engine.store
        hourly = make_job(store, start, every="1h")
        task = asyncio.create_task(r.scheduler.run())
        await r.settle()
        (run,) = js.runs(store, hourly.id)
        assert run.status == "done" and run.due == start + 5 * 3600
        assert "caught up once for 5 instants" in run.detail
        assert len(r.provider.requests) == 1  # five missed instants, one turn
        assert "caught up once" in last_user_text(r.provider.requests[0])
        assert js.get_job(store, hourly.id).next_run == start + 6 * 3600
        task.cancel()


async def test_a_missed_job_with_catch_up_skip_or_past_the_grace_is_recorded_skipped():
    start = local(2026, 6, 1, 8, 0)
    later = start + 3 * 3600 + 60
    async with rig([], later, run_scheduler=False, grace_s=1800) as r:
        store = r.engine.store
        skip = make_job(store, start, every="1h", catch_up="skip")
        stale = make_job(store, start, at="2026-06-01 09:00")  # once, but past the grace
        task = asyncio.create_task(r.scheduler.run())
        await r.settle()
        (skipped,) = js.runs(store, skip.id)
        assert skipped.status == "skipped" and "catch_up = skip" in skipped.detail
        (old,) = js.runs(store, stale.id)
        assert old.status == "skipped" and "past the grace period" in old.detail
        assert js.get_job(store, stale.id).status == "done"
        assert js.get_job(store, skip.id).next_run == start + 4 * 3600
        assert r.provider.requests == []
        # Only the one-shot reminder's note: it will not come (the interval job says nothing).
        (note,) = r.messages
        assert note.kind == "notice" and f"job {stale.id}" in note.text
        task.cancel()


async def test_two_schedulers_on_one_home_never_fire_a_job_twice(home_db):  # both backends
    now = local(2026, 6, 1, 8, 0)
    db = home_db
    Store(db).close()  # migrated
    stores = [Store(db), Store(db)]
    try:
        ids = [make_job(stores[0], now, every="1m").id for _ in range(30)]
        clock = FakeClock(now)
        buses = [MessageBus(), MessageBus()]
        schedulers = [Scheduler(s, b, clock) for s, b in zip(stores, buses, strict=True)]
        tasks = [asyncio.create_task(s.run()) for s in schedulers]
        await clock.idle(2)
        for minute in (1, 2):  # the second instant: every job is still leased (turn not ended)
            clock.set(now + 60 * minute)
            await clock.idle(2)
        fired = [buses[i].inbound.qsize() for i in (0, 1)]
        assert sum(fired) == 30 and sorted(schedulers[i].fired for i in (0, 1)) == sorted(fired)
        messages = [
            b.inbound.get_nowait().meta["job"] for b in buses for _ in range(b.inbound.qsize())
        ]
        assert sorted(int(m) for m in messages) == ids
        assert len(js.runs(stores[0], limit=1000)) == 30
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for store in stores:
            store.close()


def test_claims_racing_on_two_connections_in_threads_decide_each_instant_once(db):
    """On both backends: SQLite's BEGIN IMMEDIATE serializes the claims, PostgreSQL's row
    locks do (two `heron serve --workers` faces each run a scheduler on one database)."""
    now = local(2026, 6, 1, 8, 0)
    seed = Store(db)
    for _ in range(200):
        make_job(seed, now, every="1m")
    seed.close()
    got: list[list[js.Fire]] = [[], []]
    # The two schedulers share one clock: both claim at each instant before either moves on
    # (one running a minute ahead of the other would rightly catch two instants up as one).
    same_clock = threading.Barrier(2, timeout=60)

    def claim(i: int) -> None:
        store = Store(db)
        try:
            for step in range(1, 4):
                same_clock.wait()
                fires = js.claim_due(store, f"owner-{i}", 1, now + 60 * step + 1, 3600)
                got[i].extend(fires)
                for fire in fires:
                    js.finish_run(store, fire.run_id, status="done", outcome="silent", now=now)
        finally:
            store.close()

    threads = [threading.Thread(target=claim, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    decided = [(f.job.id, f.due) for f in got[0] + got[1]]
    assert len(decided) == len(set(decided)) == 600  # 200 jobs x 3 instants, each once


async def test_a_monitor_that_does_not_call_message_shows_nothing():
    async with rig(
        lambda _: answer("Checked the feed: nothing new."), local(2026, 6, 1, 8, 0)
    ) as r:
        store = r.engine.store
        job = make_job(store, r.clock.now(), mode="monitor", every="1h")
        await r.at(local(2026, 6, 1, 9, 0))
        (run,) = js.runs(store, job.id)
        assert (run.status, run.outcome) == ("done", "silent")
        assert r.messages == []  # no answer, no error, nothing on any channel
        assert store.conversation("chat-1") is None  # the conversation it came from is untouched
        texts = [m.parts[0].text for m in r.transcript(f"cron:{job.id}")]
        assert texts[-1] == "Checked the feed: nothing new."


async def test_a_monitor_that_calls_message_reaches_its_conversation():
    replies = [call("message", {"text": "The price dropped to 40."}), answer("Told them.")]
    async with rig(replies, local(2026, 6, 1, 8, 0)) as r:
        job = make_job(r.engine.store, r.clock.now(), mode="monitor", every="1h")
        await r.at(local(2026, 6, 1, 9, 0))
        assert [(m.kind, m.chat_id, m.key, m.text) for m in r.messages] == [
            ("message", "chat-1", "chat-1", "The price dropped to 40.")
        ]  # to the conversation it was made in, where its user is; not to cron:<id>
        assert js.runs(r.engine.store, job.id)[0].outcome == "spoke_via_tool"


async def test_a_scheduled_turn_cannot_create_jobs():
    create = {"action": "create", "prompt": "again", "every": "1m"}
    replies = [call("schedule", create), answer("Could not.")]
    async with rig(replies, local(2026, 6, 1, 8, 0)) as r:
        job = make_job(r.engine.store, r.clock.now(), mode="monitor", every="1h")
        await r.at(local(2026, 6, 1, 9, 0))
        assert [j.id for j in js.list_jobs(r.engine.store, everything=True) if not j.builtin] == [
            job.id
        ]
        result = r.provider.requests[1].messages[-1].parts[0]
        assert result.is_error and "cannot create jobs" in result.content


async def test_the_schedule_tool_binds_the_job_to_its_conversation_and_says_when_none_fires():
    create = {"action": "create", "prompt": "Water the plants.", "cron": "0 18 * * *"}
    replies = [call("schedule", create), answer("Saved."), call("schedule", {"action": "list"})]
    replies += [answer("Listed.")]
    async with rig(replies, local(2026, 6, 1, 8, 0), run_scheduler=False) as r:
        r.engine.attached.jobs_changed = None  # as in `heron chat` with no `heron serve`
        await r.loop.dispatch(InboundMessage("terminal", "1", "remind me at six", "chat-9"))
        await r.loop.wait_idle()
        await r.loop.dispatch(InboundMessage("terminal", "1", "what is scheduled?", "chat-9"))
        await r.loop.wait_idle()
        (job,) = [j for j in js.list_jobs(r.engine.store) if not j.builtin]
        assert (job.conversation, job.mode, job.schedule.spec) == (
            "chat-9",
            "reminder",
            "0 18 * * *",
        )
        created = r.provider.requests[1].messages[-1].parts[0].content
        assert "saved; it fires while `heron serve` runs" in created
        listed = r.provider.requests[3].messages[-1].parts[0].content
        assert f"job {job.id} [reminder, active]" in listed and "Water the plants." in listed


async def test_a_reminder_due_during_a_user_turn_waits_for_its_own_turn():
    gate = asyncio.Event()

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Wait for the test."""
        await gate.wait()
        return "ok"

    def script(request: ChatRequest) -> object:
        text = last_user_text(request)
        if "long job" in text:
            return call("wait_gate", {})
        return answer("Reminder said." if "Scheduled reminder" in text else "Long job done.")

    start = local(2026, 6, 1, 8, 0)
    async with rig(script, start, registry=ToolRegistry([wait_gate])) as r:
        job = make_job(r.engine.store, start, every="1h")
        await r.loop.dispatch(InboundMessage("terminal", "1", "long job", "chat-1"))
        await asyncio.wait_for(_until_running(r.loop, "chat-1"), 10)
        r.clock.set(start + 3600)
        await r.clock.idle()
        await r.bus.inbound.join()
        gate.set()
        await r.settle()
        requests = [last_user_text(q) for q in r.provider.requests]
        # The reminder was not mailed into the running turn: it opened the next one.
        assert not any("Scheduled reminder" in q and "long job" in q for q in requests)
        assert "Scheduled reminder" in requests[-1]
        assert js.runs(r.engine.store, job.id)[0].outcome == "delivered"


async def _until_running(loop: AgentLoop, key: str) -> None:
    while not loop.running(key):
        await asyncio.sleep(0)


async def test_stopping_the_scheduler_records_its_open_runs_as_interrupted():
    never = asyncio.Event()

    async def hang(request: ChatRequest) -> object:
        await never.wait()
        return answer("late")

    provider = ScriptedProvider(hang)
    start = local(2026, 6, 1, 8, 0)
    async with Engine.open(Settings.load(), provider=provider, registry=ToolRegistry([])) as engine:
        bus = MessageBus()
        loop = AgentLoop(engine, bus)
        clock = FakeClock(start)
        scheduler = Scheduler(engine.store, bus, clock)
        scheduler.watch(loop)
        job = make_job(engine.store, start, every="1h")
        task = asyncio.create_task(scheduler.run())
        await clock.idle()
        clock.set(start + 3600)
        await clock.idle()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        (run,) = js.runs(engine.store, job.id)
        assert run.status == "interrupted"
        assert js.get_job(engine.store, job.id).lease_owner is None
        await loop.close()


async def test_run_proactive_as_a_service_of_the_loop_fires_jobs_and_cleans_up_after_itself():
    from heron.proactive.background import run_proactive

    start = local(2026, 6, 1, 8, 0)
    async with rig(lambda _: answer("On it."), start, run_scheduler=False) as r:
        job = make_job(r.engine.store, start, every="1h")
        task = asyncio.create_task(run_proactive(r.loop, clock=r.clock))
        await r.clock.idle(2)  # the scheduler and the heartbeat wait on the clock
        assert r.engine.attached.jobs_changed is not None and len(r.loop.turn_end_hooks) == 3
        r.clock.set(start + 3600)
        await r.clock.idle(2)
        await r.bus.inbound.join()
        await r.loop.wait_idle()
        await r.bus.outbound.join()
        assert js.runs(r.engine.store, job.id)[0].outcome == "delivered"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert r.engine.attached.jobs_changed is None and len(r.loop.turn_end_hooks) == 1


def test_a_run_left_open_by_a_killed_scheduler_is_marked_interrupted_when_the_job_is_next_due():
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid now names no process: a scheduler killed with its turn running
    store = Store(":memory:")
    start = local(2026, 6, 1, 8, 0)
    job = make_job(store, start, every="1h")
    (fire,) = js.claim_due(store, "host:dead", dead.pid, start + 3600, 3600)
    assert js.get_job(store, job.id).lease_owner == "host:dead"
    (again,) = js.claim_due(store, "host:new", 4242, start + 7200, 3600)
    old, new = sorted(js.runs(store, job.id), key=lambda r: r.id)
    assert (old.id, old.status) == (fire.run_id, "interrupted")
    assert "killed or crashed" in old.detail
    assert (new.id, new.status) == (again.run_id, "running")


async def test_with_tz_set_the_jobs_zone_and_the_models_clock_agree(monkeypatch):
    """A TZ variable is this process's local time, and what the runtime block shows the model:
    "remind me at six" must be read in the same zone (QA18g #2: read as UTC, 13:00 in New York)."""
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        create = {"action": "create", "prompt": "Call mum.", "cron": "0 18 * * *"}
        async with rig([call("schedule", create), answer("Saved.")], local(2026, 6, 1, 8, 0)) as r:
            await r.loop.dispatch(InboundMessage("terminal", "1", "remind me at six", "tz"))
            await r.loop.wait_idle()
            (job,) = [j for j in js.list_jobs(r.engine.store) if not j.builtin]
            told = r.provider.requests[0].messages[-1].text
    finally:
        monkeypatch.undo()
        time.tzset()
    assert job.schedule.timezone == "America/New_York"
    assert "(America/New_York)" in told


async def test_a_conversation_a_reminder_opens_is_titled_with_its_prompt_not_heron_s_wrapper():
    async with rig(lambda _: answer("Time for stand-up."), local(2026, 6, 1, 8, 0)) as r:
        store = r.engine.store
        make_job(store, r.clock.now(), every="1h")
        r.scheduler.poke()
        await r.at(local(2026, 6, 1, 9, 0))
        await r.settle()
        conversation = store.conversation("chat-1")
        assert conversation is not None
        assert conversation.title == "Stand-up in five minutes."


async def test_a_reminder_failing_run_after_run_says_so_in_its_conversation_once_per_streak(
    caplog,
):
    """One report per failing streak, in every client: the note kept in the conversation (the
    error, then its hint, on one line), never the failed turn's own error besides it, nor again
    at each later failure (qa24c M4)."""
    from heron.errors import ProviderError

    down = {"yes": True}

    def script(_: ChatRequest) -> object:
        if down["yes"]:
            raise ProviderError("HTTP 500 from the model server", hint="Is it running?")
        return answer("Stand-up now.")

    def notes(store: Store) -> list[str]:
        rows = store.branch(store.conversation("chat-1").id)
        return [
            r.message.text for r in rows if "failed" in r.message.text and "job" in r.message.text
        ]

    caplog.set_level("INFO", logger="heron.agent.loop")
    async with rig(script, local(2026, 6, 1, 8, 59)) as r:
        store = r.engine.store
        job = make_job(store, r.clock.now(), every="1m")
        for minute in range(3):  # three failures in a row: one note
            await r.at(local(2026, 6, 1, 9, minute))
            await r.settle()
        assert [run.status for run in js.runs(store, job.id)][:3] == ["failed"] * 3
        (note,) = notes(store)
        assert f"[Scheduled reminder, job {job.id}: its run failed" in note
        assert "(HTTP 500 from the model server. Is it running?)" in note
        assert f"heron jobs runs {job.id}" in note
        # Said once to the client that has it open, as the note; the failed turns say nothing
        # more, live or after a reload (and never "your message is saved; send /retry").
        from heron.web.transcript import build

        told = [o.text for o in r.messages if "failed" in o.text]
        assert told == [note]
        assert [i.text for i in build(store, "chat-1").items if i.failed] == []
        # The serve's log calls each a failure, on one line (qa24c L1); at INFO, as a serve
        # logs it: WARNING would show on the screen of a chat in its own process.
        logged = [
            (r.levelname, r.getMessage()) for r in caplog.records if "chat-1" in r.getMessage()
        ]
        failed = (
            "INFO",
            "turn failed in chat-1: HTTP 500 from the model server. Is it running?",
        )
        assert logged.count(failed) == 3 and not any("delivered" in m for _, m in logged)
        down["yes"] = False
        await r.at(local(2026, 6, 1, 9, 3))
        await r.settle()
        down["yes"] = True
        await r.at(local(2026, 6, 1, 9, 4))
        await r.settle()
        assert len(notes(store)) == 2  # a new streak after a success: said again


async def test_no_background_turn_creates_a_job_and_a_subagent_has_no_schedule_tool():
    """A reminder's subagent made per-minute jobs, whose reminders spawned subagents that made
    more: a turn nobody typed (a subagent's, a heartbeat's) creates no job at all."""
    from heron.proactive.subagents import WITHOUT

    create = {"action": "create", "prompt": "BRED JOB tick", "every": "1m"}
    replies = [call("schedule", create), answer("Could not."), call("schedule", create)]
    replies += [answer("Could not either.")]
    async with rig(replies, local(2026, 6, 1, 8, 0), run_scheduler=False) as r:
        for provenance in ("subagent", "scheduled"):
            await r.loop.dispatch(
                InboundMessage(
                    "subagent", "x", "make a job", f"subagent:{provenance}", provenance=provenance
                )
            )
            await r.loop.wait_idle()
        made = [j for j in js.list_jobs(r.engine.store, everything=True) if not j.builtin]
        results = [r.provider.requests[n].messages[-1].parts[0] for n in (1, 3)]
    assert made == []
    assert all(res.is_error and "cannot create jobs" in res.content for res in results)
    assert "schedule" in WITHOUT


async def test_the_agent_keeps_at_most_ten_jobs_in_a_conversation_and_is_told_why():
    monitors = [
        ToolCall(
            f"c{n}",
            "schedule",
            {"action": "create", "prompt": f"check {n}", "every": "1m", "mode": "monitor"},
        )
        for n in range(12)
    ]
    replies = [Reply(monitors, "tool"), answer("Made what I could.")]
    async with rig(replies, local(2026, 6, 1, 8, 0), run_scheduler=False) as r:
        await r.loop.dispatch(InboundMessage("terminal", "1", "watch everything", "chat-9"))
        await r.loop.wait_idle()
        made = [j for j in js.list_jobs(r.engine.store) if not j.builtin]
        results = [p for m in r.provider.requests[1].messages[-12:] for p in m.parts]
    refused = [p for p in results if getattr(p, "is_error", False)]
    assert len(made) == MAX_AGENT_JOBS_HERE == 10
    assert len(refused) == 2 and "already has 10 active or paused jobs" in refused[0].content
    assert "heron jobs add" in refused[0].content
