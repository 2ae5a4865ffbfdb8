"""The nightly review as the scheduler's built-in job: it fires once at its instant on a fake
clock, waits while a turn the person started runs, fires once across two schedulers, is
caught up after downtime, proposes without writing, and follows config.toml and `heron jobs`."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from zoneinfo import ZoneInfo

from proactive_helpers import conversation_of, migrated_before
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import InboundMessage, MessageBus
from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text, Usage, assistant, user
from heron.proactive import review
from heron.proactive.clock import FakeClock
from heron.proactive.scheduler import Scheduler
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.store import Store
from heron.store import jobs as js
from heron.store.schedule import parse
from heron.tools.context import TurnServices
from heron.tools.registry import ToolContext, ToolRegistry
from heron.tools.schedule import schedule

BERLIN = ZoneInfo("Europe/Berlin")
FACT = (
    '{"facts": [{"path": "personal/always/tea", "quote": "I drink green tea every morning."}],'
    ' "lessons": []}'
)


def local(*args: int) -> float:
    return dt.datetime(*args, tzinfo=BERLIN).timestamp()


class Model:
    """Facts for the review's requests; a chat turn in `personal` waits for `release`."""

    def __init__(self) -> None:
        self.review_calls = 0
        self.chatting = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, request: ChatRequest) -> Reply:
        if conversation_of(request) == "personal":
            self.chatting.set()
            await self.release.wait()
            return Reply([Text("Good morning.")], "done", Usage(10, 2))
        self.review_calls += 1
        body = FACT if "QUOTABLE" in request.messages[0].text else "{}"
        return Reply([Text(body)], "done", Usage(500, 50))


def _config(home, text: str) -> None:
    (home / "config.toml").write_text('[agent]\ntimezone = "Europe/Berlin"\n' + text)


def _tree(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*.md")}


@dataclass
class Rig:
    engine: Engine
    loop: AgentLoop
    clock: FakeClock
    scheduler: Scheduler
    model: Model

    @property
    def store(self) -> Store:
        return self.engine.store

    async def at(self, when: float) -> None:
        """Move the clock; until the review it fired (if any) has ended and the scheduler
        waits again."""
        self.clock.set(when)
        await self.clock.idle()
        await self.scheduler.drain()
        await self.clock.idle()


@contextlib.asynccontextmanager
async def rig(start: float, *, started: bool = True) -> AsyncIterator[Rig]:
    model = Model()
    settings = Settings.load()
    provider = ScriptedProvider(model)
    async with Engine.open(settings, provider=provider, registry=ToolRegistry([])) as engine:
        loop = AgentLoop(engine, MessageBus())
        clock = FakeClock(start)
        scheduler = Scheduler(
            engine.store,
            loop.bus,
            clock,
            review=partial(review.run_pass, engine),
            user_busy=loop.user_turn_running,
            zone=settings.timezone,
        )
        tasks = [asyncio.create_task(loop.run(idle=False))]
        found = Rig(engine, loop, clock, scheduler, model)
        if started:
            await review.sync_job(engine, start)
            tasks.append(asyncio.create_task(scheduler.run()))
            await clock.idle()
        try:
            yield found
        finally:
            await loop.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _talk(store: Store, key: str, said: str) -> None:
    conv = store.open_conversation(key)
    store.append(conv.id, user(said))
    store.append(conv.id, assistant("Noted."))


async def test_it_fires_once_at_its_instant_proposes_and_never_writes(heron_home):
    _config(heron_home, '[review]\ntime = "03:30"\n')
    async with rig(local(2026, 6, 1, 12, 0)) as r:
        _talk(r.store, "chat-1", "I drink green tea every morning.")
        job = js.review_job(r.store)
        instant = local(2026, 6, 2, 3, 30)
        assert job.next_run == instant and job.schedule.spec == "30 3 * * *"
        root = r.engine.memory.files.root
        before, history = _tree(root), r.engine.memory.history.log()
        await r.at(instant - 1)
        assert js.runs(r.store, job.id) == [] and r.model.review_calls == 0
        await r.at(instant)
        (run,) = js.runs(r.store, job.id)
        assert (run.status, run.outcome, run.due) == ("done", "reviewed", instant)
        assert "1 conversation(s) read" in run.detail and "1 suggestion(s) queued" in run.detail
        assert _tree(root) == before and r.engine.memory.history.log() == history
        assert [s.kind for s in r.engine.memory.waiting()] == ["fact"]
        assert js.review_job(r.store).next_run == local(2026, 6, 3, 3, 30)
        assert js.review_job(r.store).lease_owner is None
        await r.at(local(2026, 6, 2, 12, 0))  # nothing more due that day
        assert len(js.runs(r.store, job.id)) == 1


async def test_it_is_skipped_while_a_turn_of_the_person_runs_and_tries_again(heron_home):
    _config(heron_home, "")
    async with rig(local(2026, 6, 1, 12, 0)) as r:
        _talk(r.store, "chat-1", "I drink green tea every morning.")
        job = js.review_job(r.store)
        instant = local(2026, 6, 2, 3, 0)  # the default time
        assert job.next_run == instant
        r.loop.bus.inbound.put_nowait(InboundMessage("test", "1", "Good morning", "personal"))
        await r.model.chatting.wait()
        await r.at(instant)
        (skipped,) = js.runs(r.store, job.id)
        assert skipped.status == "skipped"
        assert "a turn you started was running; it tries again at 03:30" in skipped.detail
        assert r.model.review_calls == 0
        assert js.review_job(r.store).next_run == instant + 1800
        r.model.release.set()
        await r.loop.wait_idle()
        await r.at(instant + 1800)
        done, _ = js.runs(r.store, job.id)
        assert done.status == "done" and "2 conversation(s) read" in done.detail
        assert r.model.review_calls == 2  # chat-1 and the turn that was running
        assert js.review_job(r.store).next_run == local(2026, 6, 3, 3, 0)  # back on schedule


async def test_a_run_now_skipped_for_a_running_turn_leaves_its_schedule(heron_home):
    """`heron jobs run-now` of the review while a turn runs is skipped, and that is all: its
    03:00 instant stays (a scheduled fire skipped so tries again; a manual one is not)."""
    _config(heron_home, "")
    async with rig(local(2026, 6, 1, 23, 30)) as r:
        job = js.review_job(r.store)
        instant = local(2026, 6, 2, 3, 0)
        r.loop.bus.inbound.put_nowait(InboundMessage("test", "1", "Good morning", "personal"))
        await r.model.chatting.wait()
        js.request_run(r.store, job.id, r.clock.now())
        r.scheduler.poke()
        await r.at(local(2026, 6, 1, 23, 38))
        (skipped,) = js.runs(r.store, job.id)
        assert skipped.status == "skipped" and "tries again" not in skipped.detail
        assert "a turn you started was running" in skipped.detail
        after = js.review_job(r.store)
        assert (after.next_run, after.status) == (instant, "active")
        r.model.release.set()
        await r.loop.wait_idle()
        await r.at(local(2026, 6, 2, 0, 10))  # where the skip used to move it: nothing runs
        assert len(js.runs(r.store, job.id)) == 1 and r.model.review_calls == 0


async def test_missed_while_nothing_ran_it_is_caught_up_once_on_start(heron_home):
    _config(heron_home, "")
    start = local(2026, 6, 1, 12, 0)
    async with rig(start, started=False) as r:
        await review.sync_job(r.engine, start)  # an earlier serve set it up, then stopped
        r.clock.set(local(2026, 6, 4, 5, 0))  # three nights later; the last within the grace
        await review.sync_job(r.engine, r.clock.now())  # a restart keeps the missed instant
        task = asyncio.create_task(r.scheduler.run())
        await r.clock.idle()
        await r.scheduler.drain()
        (run,) = js.runs(r.store, js.review_job(r.store).id)
        assert run.status == "done" and "caught up once for 3 instants" in run.detail
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_two_schedulers_on_one_home_run_it_once(heron_home):
    _config(heron_home, "")
    db = Settings.load().paths.ensure().db
    stores = [Store(db), Store(db)]
    passes: list[int] = []

    async def one_pass(i: int) -> str:
        passes.append(i)
        await asyncio.sleep(0)
        return "nightly review: test"

    try:
        now = local(2026, 6, 1, 12, 0)
        schedule_, enabled = review.job_schedule(Settings.load().config)
        job = js.sync_review(stores[0], schedule_, enabled, now, review.JOB_PROMPT)
        clock = FakeClock(now)
        schedulers = [
            Scheduler(s, MessageBus(), clock, review=partial(one_pass, i))
            for i, s in enumerate(stores)
        ]
        tasks = [asyncio.create_task(s.run()) for s in schedulers]
        await clock.idle(2)
        clock.set(job.next_run)
        await clock.idle(2)
        for s in schedulers:
            await s.drain()
        assert len(passes) == 1
        assert [r.status for r in js.runs(stores[1], job.id)] == ["done"]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for store in stores:
            store.close()


def test_config_decides_its_time_and_whether_it_runs_and_jobs_cancel_refuses_it(heron_home):
    cli = CliRunner()
    _config(heron_home, '[review]\ntime = "04:15"\n')
    listed = cli.invoke(app, ["jobs", "list"]).output
    assert "No scheduled jobs." in listed  # none of the person's: the review is apart
    (line,) = [line for line in listed.splitlines() if "nightly review" in line]
    assert line.startswith("Built-in: the nightly review of memory (job ")
    assert "cron 15 4 * * * (Europe/Berlin): next " in line
    job_id = re.search(r"\(job (\d+)\)", line).group(1)
    assert f"(heron jobs pause {job_id})" in line
    refused = cli.invoke(app, ["jobs", "cancel", job_id])
    assert refused.exit_code == 1
    assert f"job {job_id} is Heron's built-in nightly review of memory" in refused.output
    assert f"heron jobs pause {job_id} (heron jobs resume {job_id} brings" in refused.output
    assert "enabled = false" in refused.output and " ID" not in refused.output
    assert "next " in cli.invoke(app, ["jobs", "list"]).output  # still on
    paused = cli.invoke(app, ["jobs", "pause", job_id])
    assert paused.exit_code == 0 and "[built-in review, paused]" in paused.output
    _config(heron_home, "[review]\nenabled = true\n")  # config turns it on; a pause stays
    assert f"(heron jobs resume {job_id})" in cli.invoke(app, ["jobs", "list"]).output
    assert cli.invoke(app, ["jobs", "resume", job_id]).exit_code == 0
    _config(heron_home, "[review]\nenabled = false\n")
    assert "nightly review" not in cli.invoke(app, ["jobs", "list"]).output
    assert "off ([review] enabled = true" in cli.invoke(app, ["jobs", "list", "--all"]).output
    _config(heron_home, "[review]\nenabled = true\n")  # config wins
    assert "Built-in: the nightly review" in cli.invoke(app, ["jobs", "list"]).output
    _config(heron_home, "[memory]\nreview_every_hours = 0\n")  # the older switch
    assert "nightly review" not in cli.invoke(app, ["jobs", "list"]).output
    _config(heron_home, '[review]\ntime = "25:00"\n')
    bad = cli.invoke(app, ["jobs", "list"])
    assert bad.exit_code == 2 and "[review] time must be a time of day as HH:MM" in bad.output


async def test_the_agent_cannot_cancel_it(heron_home):
    _config(heron_home, "")
    async with rig(local(2026, 6, 1, 12, 0)) as r:
        job = js.review_job(r.store)
        ctx = ToolContext(heron_home, services=TurnServices(r.store, conversation_key="chat-1"))
        refused = await schedule.run(ctx, {"action": "cancel", "job": job.id})
        assert refused.is_error and "only the user pauses or turns it off" in refused.text
        assert js.review_job(r.store).status == "active"


def test_the_migration_keeps_every_job_and_run_and_adds_the_review(tmp_path):
    conn = migrated_before(tmp_path / "old.db", "m010")
    conn.execute(
        "INSERT INTO jobs (id, kind, spec, timezone, conversation, mode, prompt, created,"
        " created_by, next_run) VALUES (7, 'every', '3600', 'UTC', 'c', 'monitor', 'p', 0,"
        " 'cli', 3600)"
    )
    conn.execute("INSERT INTO job_runs (job_id, due, started, status) VALUES (7, 0, 0, 'done')")
    conn.close()
    store = Store(tmp_path / "old.db")
    try:
        kept = js.get_job(store, 7)
        assert (kept.mode, kept.next_run, kept.conversation) == ("monitor", 3600, "c")
        assert [r.status for r in js.runs(store, 7)] == ["done"]
        built = js.review_job(store)
        assert built is not None and built.builtin and built.id != 7
        assert [j.id for j in js.list_jobs(store, conversation="c")] == [7]
    finally:
        store.close()


def _review_at(store: Store, hhmm: str, now: float) -> js.Job:
    hour, minute = (int(x) for x in hhmm.split(":"))
    when = parse(cron=f"{minute} {hour} * * *", timezone="Europe/Berlin")
    return js.sync_review(store, when, True, now, review.JOB_PROMPT)


def _pass(store: Store, at: float, status: str = "done") -> None:
    """The review fired at `at` (as the scheduler's claim does) and ended `status`."""
    (fire,) = js.claim_due(store, "test", 1, at, 3600.0, modes=(js.REVIEW,))
    js.finish_run(store, fire.run_id, status=status, outcome="reviewed", now=at + 5)


def test_a_new_review_time_later_the_same_day_is_not_a_second_pass(heron_home):
    store = Store(Settings.load().paths.ensure().db)
    try:
        job = _review_at(store, "13:40", local(2026, 12, 5, 12, 0))
        assert job.next_run == local(2026, 12, 5, 13, 40)
        _pass(store, local(2026, 12, 5, 13, 40))
        moved = _review_at(store, "13:45", local(2026, 12, 5, 13, 42))
        assert moved.next_run == local(2026, 12, 6, 13, 45)  # tomorrow, not in three minutes
        assert js.claim_due(store, "test", 1, local(2026, 12, 5, 13, 45), 3600.0) == []
        # Earlier the next day, before that day's pass: the new time holds that same day.
        again = _review_at(store, "13:50", local(2026, 12, 6, 9, 0))
        assert again.next_run == local(2026, 12, 6, 13, 50)
    finally:
        store.close()


def test_a_failed_pass_today_does_not_hold_back_a_new_time_later_today(heron_home):
    store = Store(Settings.load().paths.ensure().db)
    try:
        _review_at(store, "13:40", local(2026, 12, 5, 12, 0))
        _pass(store, local(2026, 12, 5, 13, 40), status="failed")
        moved = _review_at(store, "13:45", local(2026, 12, 5, 13, 42))
        assert moved.next_run == local(2026, 12, 5, 13, 45)
    finally:
        store.close()
