"""The heartbeat on a fake clock: HEARTBEAT.md checked silently in `heartbeat`, speaking only
through `message`, skipped while the person's turn runs, missed ticks coalesced, one tick per
period across schedulers, a bounded tail, and no jobs made from it."""

from __future__ import annotations

import asyncio
import dataclasses

from schedule_helpers import answer, call, last_user_text, rig

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import MessageBus
from heron.config import Settings
from heron.proactive.background import services
from heron.proactive.clock import FakeClock
from heron.proactive.heartbeat import KEY, Heartbeat, heartbeat_lines
from heron.proactive.scheduler import NO_TOOLS
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.store import jobs as js
from heron.tools.registry import ToolRegistry

START = 1_780_000_000.0
PERIOD = 30 * 60.0
FILE = (
    "# Things to watch\n<!-- a comment -->\n\n- the build on CI is green\n- no mail from the bank\n"
)


def heartbeat_of(r, busy=lambda: False, tail: int = 8) -> Heartbeat:
    workspace = r.engine.settings.paths.workspace
    beat = Heartbeat(r.engine.store, r.bus, r.clock, workspace, 30, busy, tail_turns=tail)
    beat.watch(r.loop)
    return beat


async def started(r, beat: Heartbeat) -> asyncio.Task:
    task = asyncio.create_task(beat.run())
    await r.clock.idle()
    return task


def test_only_real_lines_of_heartbeat_md_are_checked(tmp_path):
    assert heartbeat_lines(tmp_path) == []
    (tmp_path / "HEARTBEAT.md").write_text(FILE)
    assert heartbeat_lines(tmp_path) == ["the build on CI is green", "no mail from the bank"]


async def test_a_check_that_finds_nothing_shows_nothing_and_one_that_must_speaks_by_message():
    replies = [answer("Checked both: fine."), call("message", {"text": "The build is red."})]
    replies.append(answer("Told them."))
    async with rig(replies, START, run_scheduler=False) as r:
        (r.engine.settings.paths.workspace / "HEARTBEAT.md").write_text(FILE)
        beat = heartbeat_of(r)
        task = await started(r, beat)
        await r.at(START + PERIOD - 1)
        assert r.provider.requests == []  # not before its period
        await r.at(START + PERIOD)
        asked = last_user_text(r.provider.requests[0])
        assert "- the build on CI is green\n- no mail from the bank" in asked
        assert "Things to watch" not in asked and "a comment" not in asked
        assert r.messages == []  # silent: no answer, nothing on any channel
        assert js.tick(r.engine.store, KEY).outcome == "silent"
        await r.at(START + 2 * PERIOD)
        # It reaches the person's own conversation, not the silent `heartbeat`.
        assert [(m.kind, m.key, m.text) for m in r.messages] == [
            ("message", "personal", "The build is red.")
        ]
        assert js.tick(r.engine.store, KEY).outcome == "spoke_via_tool"
        assert r.engine.store.conversation(KEY) is not None
        # Kept in `personal` too, as Heron's, labelled for its model; the tool said so.
        store = r.engine.store
        personal = store.conversation("personal")
        assert personal is not None
        (row,) = store.branch(personal.id)
        assert (row.author, row.role, row.message.text) == ("heron", "user", "The build is red.")
        label = "[Sent to the user by the heartbeat check, not written by the user] "
        assert row.wire.text == label + "The build is red." and row.meta == {
            "spoken_in": KEY,
            "said_by": "the heartbeat check",
        }
        told = [p.content for p in r.provider.requests[-1].messages[-1].parts]
        assert told == ["Sent to the user and kept in conversation 'personal'."]
        task.cancel()


async def test_skipped_while_a_turn_of_the_person_runs_and_when_there_is_nothing_to_check():
    busy = {"now": True}
    async with rig([answer("ok")], START, run_scheduler=False) as r:
        beat = heartbeat_of(r, busy=lambda: busy["now"])
        task = await started(r, beat)
        (r.engine.settings.paths.workspace / "HEARTBEAT.md").write_text(FILE)
        await r.at(START + PERIOD)
        tick = js.tick(r.engine.store, KEY)
        assert (tick.outcome, tick.detail) == ("skipped", "a turn of the user's was running")
        busy["now"] = False
        (r.engine.settings.paths.workspace / "HEARTBEAT.md").write_text("# nothing yet\n")
        await r.at(START + 2 * PERIOD)
        assert js.tick(r.engine.store, KEY).detail == "HEARTBEAT.md has nothing to check"
        assert r.provider.requests == []
        task.cancel()


async def test_missed_ticks_coalesce_into_one_check_and_a_running_check_is_not_doubled():
    gate = asyncio.Event()

    async def slow(request):
        await gate.wait()
        return answer("done")

    async with rig(slow, START, run_scheduler=False) as r:
        (r.engine.settings.paths.workspace / "HEARTBEAT.md").write_text(FILE)
        beat = heartbeat_of(r)
        task = await started(r, beat)
        r.clock.set(START + 5 * PERIOD + 7)  # five periods passed while nothing ran
        await r.clock.idle()
        await r.bus.inbound.join()
        r.clock.set(START + 7 * PERIOD)  # the check still runs: these ticks wait for it
        await r.clock.idle()
        assert beat.checks == 1 and len(r.provider.requests) == 1
        gate.set()
        await r.settle()
        assert beat.checks == 1  # the end of the check does not open a backlog
        await r.at(START + 8 * PERIOD + 7)
        assert beat.checks == 2
        task.cancel()


async def test_a_heartbeat_turn_cannot_create_jobs():
    replies = [call("schedule", {"action": "create", "prompt": "check CI", "every": "30m"})]
    replies.append(answer("Could not."))
    async with rig(replies, START, run_scheduler=False) as r:
        (r.engine.settings.paths.workspace / "HEARTBEAT.md").write_text(FILE)
        task = await started(r, heartbeat_of(r))
        await r.at(START + PERIOD)
        assert [j for j in js.list_jobs(r.engine.store, everything=True) if not j.builtin] == []
        assert "cannot create jobs" in r.provider.requests[1].messages[-1].parts[0].content
        task.cancel()


async def test_the_heartbeat_sees_a_bounded_tail_of_its_own_turns():
    async with rig(lambda _: answer("fine"), START, run_scheduler=False) as r:
        (r.engine.settings.paths.workspace / "HEARTBEAT.md").write_text(FILE)
        task = await started(r, heartbeat_of(r, tail=2))
        for n in range(1, 8):
            await r.at(START + n * PERIOD)
        sizes = [len(q.messages) for q in r.provider.requests]
        assert len(sizes) == 7
        assert max(sizes) <= 2 * 2 + 1  # two earlier turns (question, answer) and this one
        task.cancel()


async def test_two_heartbeats_on_one_home_check_once_per_period(heron_home):
    db = Settings.load().paths.ensure().db
    Store(db).close()
    stores = [Store(db), Store(db)]
    clock = FakeClock(START)
    buses = [MessageBus(), MessageBus()]
    workspace = Settings.load().paths.workspace
    (workspace / "HEARTBEAT.md").write_text(FILE)
    beats = [
        Heartbeat(s, b, clock, workspace, 30, lambda: False)
        for s, b in zip(stores, buses, strict=True)
    ]
    tasks = [asyncio.create_task(b.run()) for b in beats]
    try:
        await clock.idle(2)
        for n in (1, 2, 3):
            clock.set(START + n * PERIOD)
            await clock.idle(2)
            for beat in beats:
                beat.outstanding = False  # as if each check ended (no loop consumes these buses)
        assert sum(b.checks for b in beats) == 3
        assert buses[0].inbound.qsize() + buses[1].inbound.qsize() == 3
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for store in stores:
            store.close()


async def test_heartbeat_minutes_0_turns_it_off(heron_home):
    (heron_home / "config.toml").write_text("[agent]\nheartbeat_minutes = 0\n")
    provider = ScriptedProvider([])
    async with Engine.open(Settings.load(), provider=provider, registry=ToolRegistry([])) as engine:
        bus = MessageBus()
        scheduler, heartbeat = services(AgentLoop(engine, bus), engine, FakeClock(START))
        assert heartbeat is None and scheduler is not None


async def test_on_a_model_with_no_tools_the_heartbeat_and_monitors_are_skipped_saying_why(
    heron_home,
):
    """The offline model is offered no tools, so a silent check could never call `message`:
    no turn runs (no model call), and the tick and the monitor's run say why."""
    from heron.store.schedule import parse

    provider = ScriptedProvider([])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        engine.choice = dataclasses.replace(engine.choice, embedded=True)
        (engine.settings.paths.workspace / "HEARTBEAT.md").write_text(FILE)
        bus, clock = MessageBus(), FakeClock(START)
        loop = AgentLoop(engine, bus)
        scheduler, heartbeat = services(loop, engine, clock)
        assert heartbeat is not None
        await heartbeat.beat()  # the first tick only starts the period
        clock.set(START + PERIOD)
        assert await heartbeat.beat() == "skipped"
        tick = js.tick(engine.store, KEY)
        assert (tick.outcome, tick.detail) == ("skipped", NO_TOOLS)
        every = parse(every="1m", timezone="UTC")
        monitor = js.create_job(
            engine.store, every, conversation="personal", prompt="Is notes.txt there?",
            now=START + PERIOD, mode="monitor", created_by="test",
        )  # fmt: skip
        clock.set(START + PERIOD + 60)
        await scheduler.tick()
        (run,) = js.runs(engine.store, monitor.id)
        assert (run.status, run.outcome, run.detail) == ("skipped", "skipped", NO_TOOLS)
        assert provider.requests == [] and bus.inbound.qsize() == 0
        assert NO_TOOLS == "the model in use has no tools: it cannot message you"


async def test_a_reminder_reaches_a_model_of_a_brief_prompt_as_the_persons_words_alone(
    heron_home,
):
    """qa24c L5: the tiny offline model took Heron's "[Scheduled reminder, job N. ...]" for the
    question (3 of 3 replies off topic); a model whose profile asks for a brief prompt gets the
    reminder's words alone, others the wrapper as before."""
    from heron.store.schedule import parse

    for brief in (True, False):
        provider = ScriptedProvider([])
        async with Engine.open(Settings.load(), provider=provider) as engine:
            profile = dataclasses.replace(engine.choice.profile, brief_prompt=brief)
            engine.choice = dataclasses.replace(engine.choice, profile=profile)
            bus, clock = MessageBus(), FakeClock(START)
            scheduler, _ = services(AgentLoop(engine, bus), engine, clock)
            every = parse(every="1m", timezone="UTC")
            js.create_job(
                engine.store, every, conversation="personal", prompt="Tell me a fact about owls.",
                now=START, mode="reminder", created_by="test",
            )  # fmt: skip
            clock.set(START + 60)
            await scheduler.tick()
            sent = bus.inbound.get_nowait()
        if brief:
            assert sent.text == "Tell me a fact about owls."
        else:
            assert sent.text.startswith("[Scheduled reminder, job ")
            assert sent.text.endswith("\nTell me a fact about owls.")
