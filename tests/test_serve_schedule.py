"""The scheduler inside `heron serve`: a reminder reaches the clients of its conversation, a
monitor's `message` reaches the conversation it was made in, and `heron jobs add` knows a
serve runs."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

from serve_helpers import running_serve, ws_client, ws_hello, ws_until
from typer.testing import CliRunner

from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall
from heron.proactive.background import run_proactive
from heron.proactive.clock import FakeClock
from heron.providers.scripted import ScriptedProvider
from heron.serve.main import default_services
from heron.store import Store
from heron.store import jobs as js
from heron.store.schedule import parse

START = dt.datetime(2026, 6, 1, 8, 0, tzinfo=dt.UTC).timestamp()


def test_every_serve_runs_the_scheduler_and_the_heartbeat():
    assert run_proactive in default_services()


async def test_a_reminder_and_a_monitor_message_reach_the_clients_of_their_conversation():
    clock = FakeClock(START)

    def model(request) -> Reply:
        asked = request.messages[-1].text
        if "Scheduled check" in asked:
            return Reply([ToolCall("m1", "message", {"text": "The build is red."})], "tool")
        if request.messages[-1].role == "user" and "Scheduled reminder" in asked:
            return Reply([Text("Time for the stand-up.")], "done")
        return Reply([Text("Noted.")], "done")

    services = [lambda loop: run_proactive(loop, clock=clock)]
    serving = running_serve(ScriptedProvider(model), services=services)
    async with serving as serve, ws_client(serve) as ws:
        await ws_hello(ws, "personal")
        store = Store(Settings.load().paths.db)
        every = parse(every="1h", timezone="UTC")
        js.create_job(store, every, conversation="personal", prompt="Stand-up.", now=START)
        await clock.idle(2)
        clock.set(START + 3600)
        seen = await ws_until(ws, "turn_end")
        assert any(e.get("text") == "Time for the stand-up." for e in seen if e["type"] == "delta")
        js.create_job(
                store, every, conversation="personal", prompt="Is CI green?", now=START + 3600,
                mode="monitor",
            )  # fmt: skip
        await clock.idle(2)
        clock.set(START + 7200)
        while True:
            (event,) = (await ws_until(ws, "message"))[-1:]
            if event.get("kind") == "message":
                break
        assert event["text"] == "The build is red."
        store.close()


async def test_jobs_add_while_serve_runs_does_not_say_it_waits(heron_home):
    async with running_serve(ScriptedProvider([])):
        added = CliRunner().invoke(app, ["jobs", "add", "x", "-c", "personal", "--every", "1h"])
    assert added.exit_code == 0 and "Created job" in added.output
    assert "heron serve" not in added.output


async def test_jobs_pause_resume_and_run_now_from_another_process_reach_a_running_serve(
    monkeypatch,
):
    """`heron jobs` writes the row and tells the serve over its control socket, so the serve's
    scheduler looks at once: a run-now runs without the clock moving, a paused job does not
    fire, a resumed one fires at its next instant, not for the ones it was paused over."""
    clock = FakeClock(START)
    monkeypatch.setattr(time, "time", clock.now)  # `heron jobs` reads the system clock

    def model(request) -> Reply:
        return Reply([Text("Stand-up now.")], "done")

    services = [lambda loop: run_proactive(loop, clock=clock)]
    serving = running_serve(ScriptedProvider(model), services=services)
    async with serving as serve, ws_client(serve) as ws:
        await ws_hello(ws, "personal")
        store = Store(Settings.load().paths.db)
        hourly = parse(every="1h", timezone="UTC")
        job = js.create_job(store, hourly, conversation="personal", prompt="Stand-up.", now=START)
        await clock.idle(2)

        def cli(sub: str):  # in a thread, as from another process: the serve's loop answers
            return asyncio.to_thread(CliRunner().invoke, app, ["jobs", sub, str(job.id)])

        ran = await cli("run-now")
        assert ran.exit_code == 0 and f"Job {job.id} runs now" in ran.output, ran.output
        seen = await ws_until(ws, "turn_end")  # the clock has not moved: the serve was told
        assert any(e.get("text") == "Stand-up now." for e in seen if e["type"] == "delta")
        assert (await cli("pause")).exit_code == 0
        await clock.idle(2)
        clock.set(START + 2 * 3600 + 60)  # two instants pass while paused
        await clock.idle(2)
        assert [r.detail for r in js.runs(store, job.id)] == [js.RUN_NOW]
        resumed = await cli("resume")
        assert f"Resumed job {job.id}: next Mon 2026-06-01 11:00 UTC" in resumed.output
        await clock.idle(2)
        assert len(js.runs(store, job.id)) == 1  # nothing made up on resume
        clock.set(START + 3 * 3600)
        await ws_until(ws, "turn_end")
        runs = js.runs(store, job.id)
        assert [(r.due, r.detail) for r in runs] == [(START + 3 * 3600, None), (START, js.RUN_NOW)]
        store.close()
