"""A scheduler's start after runs were cut off (heron/store/jobs.py `recover`): a run left
`running` by a process that is gone is marked interrupted, a one-shot reminder cut off before its
turn ended runs once more, late and saying why, and only once; one whose turn had ended is not
run again; the nightly review tries again later; a reminder that will not come is said in its
conversation. Also: a per-minute job missed for days is caught up, a cron that never fires is
refused plainly."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from schedule_helpers import answer, last_user_text, rig
from test_scheduler import local, make_job

from heron.proactive.scheduler import Scheduler
from heron.store import Store
from heron.store import jobs as js
from heron.store.schedule import ScheduleError, parse


def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid now names no process: a scheduler killed with its turn running
    return dead.pid


def _crashed_fire(store: Store, job: js.Job, at: float) -> js.Fire:
    """The job fired by a scheduler that then died (kill -9) with its turn running."""
    (fire,) = js.claim_due(store, "host:dead:1", _dead_pid(), at, 3600)
    return fire


async def test_a_one_shot_reminder_cut_off_by_a_crash_runs_again_once_at_the_next_start():
    due = local(2026, 6, 1, 9, 0)
    async with rig(lambda _: answer("Water the plants now."), due + 300, run_scheduler=False) as r:
        store = r.engine.store
        job = make_job(store, due - 3600, at="2026-06-01 09:00")
        cut = _crashed_fire(store, job, due)
        assert js.get_job(store, job.id).status == "done"  # never due again by itself
        task = asyncio.create_task(r.scheduler.run())
        await r.settle()
        new, old = js.runs(store, job.id)
        assert (old.id, old.status, old.outcome) == (cut.run_id, "interrupted", js.RETRIED)
        assert "killed or crashed" in old.detail and f"run again as run {new.id}" in old.detail
        assert (new.status, new.outcome, new.due) == ("done", "delivered", due)
        (request,) = r.provider.requests
        said = last_user_text(request)
        assert "late: due 2026-06-01 09:00" in said and "cut off before its turn ended" in said
        assert js.get_job(store, job.id).lease_owner is None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # The next start finds nothing left to do: nothing runs twice.
        again = Scheduler(store, r.bus, r.clock)
        assert await again.recover() == 0
        await r.bus.inbound.join()
        await r.loop.wait_idle()
        assert len(r.provider.requests) == 1 and len(js.runs(store, job.id)) == 2


async def test_a_reminder_whose_turn_had_ended_before_the_crash_is_not_run_again():
    due = local(2026, 6, 1, 9, 0)
    async with rig(lambda _: answer("Done."), due - 60) as r:
        store = r.engine.store
        job = make_job(store, due - 3600, at="2026-06-01 09:00")
        await r.at(due)
        (run,) = js.runs(store, job.id)
        assert run.outcome == "delivered"
        # The process died after the turn ended, before it recorded the run's end.
        with store.transaction() as c:
            c.execute(
                "UPDATE job_runs SET status = 'running', outcome = NULL, ended = NULL,"
                " owner = 'host:dead:1' WHERE id = ?",
                (run.id,),
            )
            c.execute(
                "UPDATE jobs SET lease_owner = 'host:dead:1', lease_host = ?, lease_pid = ?,"
                " lease_until = ? WHERE id = ?",
                (js.HOST, _dead_pid(), due + 3600, job.id),
            )
        assert await Scheduler(store, r.bus, r.clock).recover() == 0
        await r.settle()
        (run,) = js.runs(store, job.id)
        assert (run.status, run.outcome) == ("done", "finished")
        assert len(r.provider.requests) == 1


async def test_a_run_of_a_live_scheduler_is_left_alone():
    store = Store(":memory:")
    start = local(2026, 6, 1, 8, 0)
    job = make_job(store, start, at="2026-06-01 09:00")
    import os

    (fire,) = js.claim_due(store, "host:me:1", os.getpid(), start + 3600, 3600)
    found = js.recover(store, "host:new:2", 4242, start + 3700, 3600, review_again=start + 9999)
    assert found.fires == [] and found.lost == []
    (run,) = js.runs(store, job.id)
    assert (run.id, run.status) == (fire.run_id, "running")


def test_the_nightly_review_cut_off_by_a_crash_tries_again_later():
    store = Store(":memory:")
    now = local(2026, 6, 1, 3, 5)
    review = js.sync_review(
        store, parse(cron="0 3 * * *", timezone="Europe/Berlin"), True, now - 600, "review"
    )
    (fire,) = js.claim_due(store, "host:dead:1", _dead_pid(), now - 240, 3600, modes=(js.REVIEW,))
    found = js.recover(store, "host:new:2", 4242, now, 3600, review_again=now + 1800)
    assert found.fires == [] and found.lost == []
    (run,) = js.runs(store, review.id)
    assert (run.id, run.status, run.outcome) == (fire.run_id, "interrupted", js.NOT_RETRIED)
    assert "it tries again at 03:35" in run.detail
    assert js.get_job(store, review.id).next_run == now + 1800


async def test_a_one_shot_reminder_skipped_past_the_grace_is_said_in_its_conversation():
    start = local(2026, 6, 1, 8, 0)
    async with rig([], start + 3 * 3600, run_scheduler=False, grace_s=1800) as r:
        store = r.engine.store
        job = make_job(store, start, at="2026-06-01 09:00")
        task = asyncio.create_task(r.scheduler.run())
        await r.settle()
        await r.scheduler.drain()  # the note, moved in after any turn running there
        (run,) = js.runs(store, job.id)
        assert run.status == "skipped"
        conversation = store.conversation("chat-1")
        assert conversation is not None
        (row,) = store.branch(conversation.id)
        assert row.author == "heron"
        text = row.message.text
        assert f"job {job.id}, due 2026-06-01 09:00, not delivered" in text
        assert "past the grace period" in text and "Stand-up in five minutes." in text
        assert [m.text for m in r.messages] == [text]  # shown to whoever has it open
        assert r.provider.requests == []
        task.cancel()


async def test_a_cut_off_reminder_past_the_grace_is_not_run_but_said():
    due = local(2026, 6, 1, 9, 0)
    async with rig([], due + 7200, run_scheduler=False, grace_s=1800) as r:
        store = r.engine.store
        job = make_job(store, due - 3600, at="2026-06-01 09:00")
        _crashed_fire(store, job, due)
        task = asyncio.create_task(r.scheduler.run())
        await r.settle()
        await r.scheduler.drain()
        (run,) = js.runs(store, job.id)
        assert (run.status, run.outcome) == ("interrupted", js.NOT_RETRIED)
        (row,) = store.branch(store.conversation("chat-1").id)
        assert "cut off before it ended" in row.message.text and row.author == "heron"
        assert r.provider.requests == []
        task.cancel()


def test_a_per_minute_job_missed_for_days_is_caught_up_once_at_its_latest_instant():
    store = Store(":memory:")
    start = local(2026, 6, 1, 8, 0)
    make_job(store, start, cron="* * * * *")
    now = start + 8 * 86400 + 30
    (fire,) = js.claim_due(store, "host:me:1", 4242, now, 6 * 3600)
    assert fire.due == local(2026, 6, 9, 8, 0)  # the latest missed minute, within the grace
    assert fire.detail.startswith("caught up once for over 100 instants (2026-06-01 08:01 to")


def test_an_interval_job_missed_for_days_counts_its_instants_exactly():
    store = Store(":memory:")
    start = local(2026, 6, 1, 8, 0)
    job = make_job(store, start, every="1m")
    (fire,) = js.claim_due(store, "host:me:1", 4242, start + 8 * 86400 + 30, 6 * 3600)
    assert fire.detail.startswith("caught up once for 11,520 instants")
    assert job.id and fire.due == start + 8 * 86400


@pytest.mark.parametrize("cron", ["0 9 30 2 *", "0 9 31 4 *"])
def test_a_cron_expression_that_never_fires_is_refused_plainly(cron):
    with pytest.raises(ScheduleError) as refused:
        parse(cron=cron, timezone="Europe/Berlin")
    assert "never fires" in str(refused.value) and refused.value.hint
    assert parse(cron="0 9 29 2 *", timezone="Europe/Berlin").kind == "cron"  # leap days come


def test_two_starts_at_once_run_a_cut_off_reminder_again_only_once(home_db):  # both backends
    import os
    import threading

    due = local(2026, 6, 1, 9, 0)
    Store(home_db).close()  # migrated
    stores = [Store(home_db), Store(home_db)]
    try:
        job = make_job(stores[0], due - 3600, at="2026-06-01 09:00")
        _crashed_fire(stores[0], job, due)
        found: list[js.Recovered] = []

        def start(i: int) -> None:
            found.append(
                js.recover(
                    stores[i], f"host:s{i}:1", os.getpid(), due + 300, 3600, review_again=due
                )
            )

        threads = [threading.Thread(target=start, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(len(f.fires) for f in found) == [0, 1]
        assert [r.status for r in js.runs(stores[0], job.id)] == ["running", "interrupted"]
    finally:
        for store in stores:
            store.close()


async def _killed_elsewhere(job: js.Job, at: float, host: str | None = None) -> js.Fire:
    """Another scheduler of the home (its own connection, as another serve's) fires `job`,
    then its process dies: on this host (its pid ended), or on `host` (its lease says so)."""
    from heron.config import Settings

    other = Store(Settings.load().database)
    try:
        (fire,) = js.claim_due(other, "host:other:1", _dead_pid(), at, 3600)
        if host is not None:
            with other.transaction() as c:
                c.execute("UPDATE jobs SET lease_host = ? WHERE id = ?", (host, job.id))
        return fire
    finally:
        other.close()


async def test_a_running_scheduler_recovers_a_reminder_another_scheduler_died_running(home_db):
    """Two schedulers on one home (a second serve); the other is killed with a reminder's turn
    running. The one that stays up notices on its next tick (it does not start again) and
    runs the reminder once more, late and saying why; its later ticks run nothing again."""
    due = local(2026, 6, 1, 9, 0)
    async with rig(lambda _: answer("Water the plants now."), due - 60) as r:
        store = r.engine.store
        job = make_job(store, due - 3600, at="2026-06-01 09:00")
        cut = await _killed_elsewhere(job, due)
        await r.at(due + 60)  # past this scheduler's next wake: a tick, no start
        new, old = js.runs(store, job.id)
        assert (old.id, old.status, old.outcome) == (cut.run_id, "interrupted", js.RETRIED)
        assert "killed or crashed" in old.detail and f"run again as run {new.id}" in old.detail
        assert (new.status, new.outcome) == ("done", "delivered")
        (request,) = r.provider.requests
        assert "cut off before its turn ended" in last_user_text(request)
        await r.at(due + 600)
        assert len(r.provider.requests) == 1 and len(js.runs(store, job.id)) == 2


async def test_a_running_scheduler_waits_for_the_lease_of_a_scheduler_on_another_host():
    """Another host's process cannot be seen: its run is left running while its lease holds,
    and recovered on the first tick after the lease expired (never by time alone here)."""
    due = local(2026, 6, 1, 9, 0)
    async with rig(lambda _: answer("Water the plants now."), due - 60) as r:
        store = r.engine.store
        job = make_job(store, due - 3600, at="2026-06-01 09:00")
        cut = await _killed_elsewhere(job, due, host="another-host")
        await r.at(due + 600)
        (run,) = js.runs(store, job.id)
        assert (run.id, run.status) == (cut.run_id, "running") and not r.provider.requests
        await r.at(due + js.LEASE_TTL + 60)
        new, old = js.runs(store, job.id)
        assert (old.status, old.outcome, new.status) == ("interrupted", js.RETRIED, "done")
        assert len(r.provider.requests) == 1


async def test_missed_times_of_a_job_in_another_zone_are_said_in_the_agents_zone():
    """A cron job reading its times in New York, missed while no scheduler ran: the catch-up
    note the person and the model read gives the missed times in the agent's zone (Berlin),
    as every other time Heron shows, not New York's clock unlabelled (qa24e M1)."""
    start = local(2026, 12, 6, 7, 20)
    async with rig(lambda _: answer("Stand-up."), start + 11 * 60, run_scheduler=False) as r:
        store = r.engine.store
        when = parse(cron="*/2 * * * *", timezone="America/New_York")
        job = js.create_job(
            store, when, conversation="chat-1", prompt="Standup", now=start, created_by="test"
        )
        task = asyncio.create_task(r.scheduler.run())
        await r.settle()
        (run,) = js.runs(store, job.id)
        assert "(2026-12-06 07:22 to 2026-12-06 07:30)" in run.detail
        assert "07:22 to 2026-12-06 07:30" in last_user_text(r.provider.requests[0])
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
