"""A person controls their jobs: pause, resume, run once now, through the store, the scheduler
on a fake clock and the `schedule` tool; and the migration that lets a job pause (m028)."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import time
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

import pytest
from proactive_helpers import migrated_before
from schedule_helpers import Rig, answer, last_user_text, rig

from heron.config import Settings
from heron.store import Store
from heron.store import jobs as js
from heron.store.schedule import ScheduleError, parse
from heron.tools.context import ToolContext, TurnServices
from heron.tools.registry import ToolOutput
from heron.tools.schedule import resumed, schedule, status_lines

BERLIN = ZoneInfo("Europe/Berlin")


def local(*args: int) -> float:
    return dt.datetime(*args, tzinfo=BERLIN).timestamp()


def make_job(store: Store, now: float, **schedule: str) -> js.Job:
    when = parse(timezone="Europe/Berlin", **schedule)
    return js.create_job(
        store, when, conversation="chat-1", prompt="Water the plants.", now=now,
        created_by="test",
    )  # fmt: skip


async def poked(r: Rig, *, settle: bool = True) -> None:
    """Wake the scheduler as `heron jobs` does, and wait until it has looked (and, with
    `settle`, until what it fired has ended)."""
    r.scheduler.poke()
    while r.scheduler.wake.is_set():
        await asyncio.sleep(0)
    if settle:
        await r.settle()


async def test_a_paused_job_fires_nothing_and_resumes_without_catching_up():
    async with rig(lambda _: answer("Plants!"), local(2026, 12, 4, 12, 0)) as r:
        store = r.engine.store
        job = make_job(store, r.clock.now(), cron="0 9 * * 1-5")
        assert js.pause_job(store, job.id).changed
        assert not js.pause_job(store, job.id).changed  # twice: said, nothing more
        r.scheduler.poke()
        await r.at(local(2026, 12, 7, 9, 0))  # Monday 09:00, paused
        await r.at(local(2026, 12, 8, 12, 0))  # and Tuesday's passes too
        assert js.runs(store, job.id) == [] and r.provider.requests == []
        assert js.get_job(store, job.id) in js.list_jobs(store)  # still listed: not over
        assert js.get_job(store, job.id).status == "paused"
        done = js.resume_job(store, job.id, r.clock.now())
        assert done.changed and done.job.status == "active"
        assert done.job.next_run == local(2026, 12, 9, 9, 0)  # Wednesday: nothing made up
        await poked(r)
        assert js.runs(store, job.id) == []
        await r.at(local(2026, 12, 9, 9, 0))
        (run,) = js.runs(store, job.id)
        assert (run.status, run.due, run.detail) == ("done", local(2026, 12, 9, 9, 0), None)


async def test_a_pause_holds_across_a_restart_and_an_interval_keeps_its_phase():
    start = local(2026, 12, 4, 12, 0)
    async with rig(lambda _: answer("ok"), start, run_scheduler=False) as r:
        store = r.engine.store
        hourly = make_job(store, start, every="1h")  # 13:00, 14:00, ...
        js.pause_job(store, hourly.id)
        r.clock.set(start + 5 * 3600 + 600)  # a new scheduler starts at 17:10, paused over 5
        task = asyncio.create_task(r.scheduler.run())
        await r.settle()
        assert js.runs(store, hourly.id) == []
        resumed = js.resume_job(store, hourly.id, r.clock.now()).job
        assert resumed.next_run == start + 6 * 3600  # 18:00, on its hour
        task.cancel()


async def test_a_one_shot_paused_past_its_time_is_done_on_resume_and_can_run_now():
    start = local(2026, 12, 4, 12, 0)
    seen: list[str] = []

    def model(request) -> object:
        seen.append(last_user_text(request))
        return answer("Your plants!")

    async with rig(model, start) as r:
        store = r.engine.store
        once = make_job(store, start, at="2026-12-04 18:00")
        js.pause_job(store, once.id)
        await r.at(local(2026, 12, 4, 19, 0))
        done = js.resume_job(store, once.id, r.clock.now()).job
        assert (done.status, done.next_run) == ("done", None)
        assert "passed while it was paused" in resumed(done, "UTC")
        asked = js.request_run(store, once.id, r.clock.now())
        assert asked.changed and not js.request_run(store, once.id, r.clock.now()).changed
        await poked(r)
        (run,) = js.runs(store, once.id)
        assert (run.status, run.outcome, run.detail) == ("done", "delivered", js.RUN_NOW)
        assert js.RUN_NOW in seen[0] and "Water the plants." in seen[0]
        assert [(m.key, m.text) for m in r.messages] == [("chat-1", "Your plants!")]
        prompt = [row for row in r.transcript("chat-1") if row.role == "user"]
        assert len(prompt) == 1  # an ordinary fire: its provenance, in its conversation
        rows = store.branch(store.conversation("chat-1").id)
        assert [row.author for row in rows if row.role == "user"] == ["heron"]
        assert js.get_job(store, once.id).status == "done"  # still done: nothing scheduled


async def test_run_now_keeps_the_schedule_and_is_refused_while_the_job_runs():
    start = local(2026, 12, 4, 12, 0)
    release = asyncio.Event()
    started = asyncio.Event()

    async def model(request) -> object:
        started.set()
        await release.wait()
        return answer("Done.")

    async with rig(model, start) as r:
        store = r.engine.store
        daily = make_job(store, start, cron="0 9 * * *")
        js.request_run(store, daily.id, r.clock.now())
        await poked(r, settle=False)
        await started.wait()
        with pytest.raises(ScheduleError, match=f"job {daily.id} is running now"):
            js.request_run(store, daily.id, r.clock.now())
        release.set()
        await r.settle()
        (run,) = js.runs(store, daily.id)
        assert run.status == "done" and run.detail == js.RUN_NOW
        after = js.get_job(store, daily.id)
        assert (after.next_run, after.status, after.run_now) == (daily.next_run, "active", None)
        # Paused, it runs once when asked and stays paused.
        js.pause_job(store, daily.id)
        js.request_run(store, daily.id, r.clock.now())
        await poked(r)
        assert len(js.runs(store, daily.id)) == 2
        assert js.get_job(store, daily.id).status == "paused"


def test_a_cancelled_or_unknown_job_cannot_be_paused_resumed_or_run(db):  # both backends
    store = Store(db)
    try:
        now = local(2026, 12, 4, 12, 0)
        job = make_job(store, now, every="1h")
        js.cancel_job(store, job.id)
        for act in (
            lambda i: js.pause_job(store, i),
            lambda i: js.resume_job(store, i, now),
            lambda i: js.request_run(store, i, now),
        ):
            with pytest.raises(ScheduleError, match=f"job {job.id} is cancelled"):
                act(job.id)
            with pytest.raises(ScheduleError, match="there is no job 999"):
                act(999)
    finally:
        store.close()


def test_a_run_asked_for_then_claimed_once_or_past_the_grace_recorded_skipped(db):
    store = Store(db)
    try:
        now = local(2026, 12, 4, 12, 0)
        job = make_job(store, now, cron="0 9 * * *")
        js.request_run(store, job.id, now)
        assert js.next_due(store, unleased=True) == now  # the scheduler wakes for it
        (fire,) = js.claim_due(store, "test", 1, now + 1, 3600.0)
        assert (fire.job.id, fire.due, fire.detail) == (job.id, now, js.RUN_NOW)
        assert js.claim_due(store, "test", 1, now + 2, 3600.0) == []  # once
        js.finish_run(store, fire.run_id, status="done", outcome="delivered", now=now + 3)
        assert js.get_job(store, job.id).next_run == job.next_run  # its schedule is unmoved
        js.request_run(store, job.id, now + 10)
        assert js.claim_due(store, "test", 1, now + 7200, 3600.0) == []
        run = js.runs(store, job.id)[0]
        assert run.status == "skipped" and "asked to run now at 2026-12-04 12:00" in run.detail
        assert js.get_job(store, job.id).run_now is None
    finally:
        store.close()


@dataclass
class _Turn:  # what the tool reads of a running turn
    provenance: str
    deliver: None = None
    ask: None = None
    spoke: list[str] = field(default_factory=list)
    question: None = None
    stale: bool = False


async def test_the_schedule_tool_pauses_resumes_and_runs_now_but_a_scheduled_run_only_pauses(
    heron_home,
):
    store = Store(Settings.load().paths.ensure().db)
    pokes: list[int] = []
    try:
        job = make_job(store, time.time(), cron="0 9 * * *")
        services = TurnServices(
            store, conversation_key="chat-1", jobs_changed=lambda: pokes.append(1)
        )
        ctx = ToolContext(heron_home, services=services)

        async def act(action: str, job_id: int = job.id) -> ToolOutput:
            said = await schedule.run(ctx, {"action": action, "job": job_id})
            return said if isinstance(said, ToolOutput) else ToolOutput(said)

        paused = await act("pause")
        assert paused.text.startswith(f"Paused: job {job.id} [reminder, paused]")
        again = await act("resume")
        assert again.text.startswith(f"Resumed job {job.id}: next ") and "not made up" in again.text
        assert "Not paused" in (await act("resume")).text
        ran = await act("run_now")
        assert not ran.is_error and f"Job {job.id} runs now" in ran.text
        assert js.get_job(store, job.id).run_now is not None and len(pokes) == 3
        review_id = js.sync_review(
            store, parse(cron="0 3 * * *", timezone="UTC"), True, time.time(), "review"
        ).id
        for action in ("pause", "resume", "run_now"):
            refused = await act(action, review_id)
            assert refused.is_error and "only the user pauses or turns it off" in refused.text
        services.turn = _Turn("scheduled")
        for action in ("resume", "run_now"):
            refused = await act(action)
            assert refused.is_error and f"Background work cannot {action}" in refused.text
        assert not (await act("pause")).is_error
        missing = await act("pause", 999)
        assert missing.is_error and "There is no job 999 in this conversation" in missing.text
    finally:
        store.close()


async def test_the_schedule_tool_reaches_only_its_own_conversations_jobs(heron_home):
    """`list` showed none of another conversation's jobs, yet `cancel` (and pause, resume,
    run_now) of a guessed id acted on them: a model reading a hostile document could end the
    person's reminders everywhere. A monitor may still pause itself from its own `cron:<id>`."""
    store = Store(Settings.load().paths.ensure().db)
    try:
        job = make_job(store, time.time(), cron="0 9 * * *")  # made in chat-1
        elsewhere = ToolContext(heron_home, services=TurnServices(store, conversation_key="j2"))
        for action in ("cancel", "pause", "resume", "run_now"):
            said = await schedule.run(elsewhere, {"action": action, "job": job.id})
            assert isinstance(said, ToolOutput) and said.is_error
            assert f"There is no job {job.id} in this conversation" in said.text
        assert js.get_job(store, job.id).status == "active"
        own = ToolContext(
            heron_home, services=TurnServices(store, conversation_key=f"cron:{job.id}")
        )
        assert not isinstance(
            await schedule.run(own, {"action": "pause", "job": job.id}), ToolOutput
        )
        home = ToolContext(heron_home, services=TurnServices(store, conversation_key="chat-1"))
        said = await schedule.run(home, {"action": "cancel", "job": job.id})
        assert isinstance(said, str) and said.startswith("Cancelled:")
    finally:
        store.close()


def test_the_migration_keeps_every_job_and_run_and_lets_a_job_pause(tmp_path):
    conn = migrated_before(tmp_path / "old.db", "m028")
    conn.execute(
        "INSERT INTO jobs (id, kind, spec, timezone, conversation, mode, prompt, created,"
        " created_by, next_run, last_outcome) VALUES (7, 'every', '3600', 'UTC', 'c',"
        " 'monitor', 'p', 0, 'cli', 3600, 'silent')"
    )
    conn.execute("INSERT INTO job_runs (job_id, due, started, status) VALUES (7, 0, 0, 'done')")
    with pytest.raises(sqlite3.IntegrityError):  # what m028 lets in
        conn.execute("UPDATE jobs SET status = 'paused' WHERE id = 7")
    conn.close()
    store = Store(tmp_path / "old.db")
    try:
        kept = js.get_job(store, 7)
        assert (kept.mode, kept.next_run, kept.last_outcome, kept.run_now) == (
            "monitor", 3600, "silent", None,
        )  # fmt: skip
        assert [r.status for r in js.runs(store, 7)] == ["done"]
        assert js.pause_job(store, 7).job.status == "paused"
        assert js.review_job(store) is not None
        with pytest.raises(sqlite3.IntegrityError), store.transaction() as c:  # one review still
            c.execute(
                "INSERT INTO jobs (kind, spec, timezone, conversation, mode, prompt, created,"
                " created_by) VALUES ('cron', '0 3 * * *', 'UTC', '', 'review', 'r', 0, 'x')"
            )
    finally:
        store.close()


def test_status_says_a_paused_job_and_a_paused_review_are_paused(heron_home):
    store = Store(Settings.load().paths.ensure().db)
    try:
        now = local(2026, 12, 4, 12, 0)
        job = make_job(store, now, cron="0 9 * * *")
        when = parse(cron="0 3 * * *", timezone="Europe/Berlin")
        review = js.sync_review(store, when, True, now, "The nightly review of memory")
        js.pause_job(store, job.id)
        js.pause_job(store, review.id)
        lines = status_lines(store, "chat-1", "Europe/Berlin")
        assert f"  job {job.id} [reminder, paused] cron 0 9 * * * (Europe/Berlin), paused:" in (
            "\n".join(lines)
        )
        assert f"nightly review: job {review.id}, paused (heron jobs resume {review.id})" in lines
    finally:
        store.close()


def test_a_job_waiting_for_its_own_run_says_so_and_not_the_run_before(db):  # both backends
    """A per-minute job whose run outlasts its minute: its next time has come and gone, and
    its last outcome is the run before's. Each place that shows it says the run is running,
    since when, and that the next waits for it (not a time in the past, nor "delivered")."""
    from heron.channels.jobs_cli import job_rows, show_lines
    from heron.serve.work import work_event

    store = Store(db)
    try:
        start = local(2020, 12, 4, 12, 0)  # in the past, as the panel's clock sees it
        job = make_job(store, start, every="1m")
        (first,) = js.claim_due(store, "test", 1, start + 60, 3600.0)
        js.finish_run(store, first.run_id, status="done", outcome="delivered", now=start + 70)
        (going,) = js.claim_due(store, "test", 1, start + 120, 3600.0)  # runs on and on
        now = start + 200
        assert js.claim_due(store, "test", 1, now, 3600.0) == []  # it waits for its run
        seen = js.get_job(store, job.id)
        assert (seen.running_run, seen.running_since) == (going.run_id, start + 120)
        waits = f"due; waits for run {going.run_id} to finish"
        since = f"running since 2020-12-04 12:02 CET (run {going.run_id})"
        shown = "\n".join(show_lines(seen, now, "Europe/Berlin"))
        assert f"next:         {waits}" in shown
        assert f"last run:     {since}; the run before: delivered" in shown
        (row,) = job_rows(js.list_jobs(store, conversation="chat-1"), "Europe/Berlin", now)
        assert (row[4], row[6]) == (waits, f"running (run {going.run_id})")
        lines = status_lines(store, "chat-1", "Europe/Berlin")
        assert any(f"job {job.id} " in x and f"next {waits}, {since}:" in x for x in lines)
        (panel,) = work_event(store, "chat-1", "Europe/Berlin")["jobs"]
        assert panel["next_local"] == waits
        assert panel["running"] == {"run": going.run_id, "since": "2020-12-04 12:02 CET"}
        js.finish_run(store, going.run_id, status="done", outcome="silent", now=now)
        done = "\n".join(show_lines(js.get_job(store, job.id), now, "Europe/Berlin"))
        assert "waits" not in done and "last run:     2020-12-04 12:02 CET, silent" in done
    finally:
        store.close()
