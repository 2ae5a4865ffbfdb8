"""The `work` and `cancel` messages of the serve protocol: a conversation's goal, jobs and
subagents as one event, and each ended by the person, checked in the store."""

from __future__ import annotations

import json
import time

from serve_helpers import running_serve, ws_client, ws_hello, ws_next, ws_until

from heron.config import Settings
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.store import Store, goals, runs
from heron.store import jobs as js
from heron.store.schedule import parse


def _seed() -> tuple[int, int]:
    store = Store(Settings.load().paths.ensure().db)
    try:
        goals.set_goal(store, "s", "Migrate the blog")
        when = parse(every="1d", timezone="UTC")  # not due while the test runs
        now = time.time()
        mine = js.create_job(store, when, conversation="s", prompt="Check the feed.", now=now)
        other = js.create_job(store, when, conversation="o", prompt="Elsewhere.", now=now)
        runs.create(store, "sa_1", "subagent", "s", "Summarise the logs", status="running",
                    lineage="l1")  # fmt: skip
        runs.create(
            store, "sa_2", "subagent", "s", "Count the files", status="waiting", lineage="l2"
        )  # fmt: skip  (waits for a slot: not started)
        runs.create(store, "sa_9", "subagent", "o", "Not ours", status="running")
        return mine.id, other.id
    finally:
        store.close()


async def _ask(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    return await ws_next(ws)


async def test_work_lists_and_cancel_ends_each_piece_of_this_conversation_only():
    mine, other = _seed()
    async with running_serve(ScriptedProvider([])) as serve, ws_client(serve) as ws:
        early = await _ask(ws, {"type": "work"})
        assert early["type"] == "error" and "hello" in early["message"]
        await ws_hello(ws, "s")
        work = await _ask(ws, {"type": "work"})
        assert work["type"] == "work" and work["conversation"] == "s"
        assert work["goal"]["objective"] == "Migrate the blog"
        assert (work["goal"]["status"], work["goal"]["max_turns"]) == ("active", 20)
        assert [j["id"] for j in work["jobs"]] == [mine]  # not o's, not the built-in review
        # Its next time as the CLI shows it, in the agent's zone and naming it.
        assert work["jobs"][0]["next_local"].endswith(" UTC")
        assert [(s["id"], s["status"], s["waiting"]) for s in work["subagents"]] == [
            ("sa_1", "running", None),
            ("sa_2", "waiting", "waiting for a slot (1st in line)"),
        ]
        refused = await _ask(ws, {"type": "cancel", "target": "job", "id": other})
        assert refused["type"] == "error" and "no active job" in refused["message"]
        theirs = await _ask(ws, {"type": "cancel", "target": "subagent", "id": "sa_9"})
        assert theirs["type"] == "error"
        bad = await _ask(ws, {"type": "cancel", "target": "everything"})
        assert bad["type"] == "error" and "goal, job, subagent" in bad["hint"]
        job = await _ask(ws, {"type": "cancel", "target": "job", "id": mine})
        assert job["done"] == f"Cancelled job {mine}." and job["jobs"] == []
        sub = await _ask(ws, {"type": "cancel", "target": "subagent", "id": "sa_1"})
        assert sub["done"] == "Cancelled subagent sa_1."
        assert [s["id"] for s in sub["subagents"]] == ["sa_2"]
        goal = await _ask(ws, {"type": "cancel", "target": "goal"})
        assert goal["done"] == "Goal stopped: Migrate the blog" and goal["goal"] is None
    store = Store(Settings.load().paths.db)
    try:
        assert js.get_job(store, mine).status == "cancelled"
        assert js.get_job(store, other).status == "active"
        assert runs.get(store, "sa_1").status == "cancelled"
        assert runs.get(store, "sa_9").status == "running"
        assert goals.open_goal(store, "s") is None
        assert goals.history(store, "s")[0].status == "stopped"
    finally:
        store.close()


async def test_job_pauses_resumes_and_runs_a_job_of_this_conversation_now():
    mine, other = _seed()
    reply = Reply([Text("Feed checked.")], "done")
    async with running_serve(ScriptedProvider(lambda _: reply)) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "s")
        paused = await _ask(ws, {"type": "job", "action": "pause", "id": mine})
        assert paused["done"] == f"Paused job {mine}."
        (job,) = paused["jobs"]
        assert (job["status"], job["next_local"]) == ("paused", None)
        resumed = await _ask(ws, {"type": "job", "action": "resume", "id": mine})
        assert resumed["done"].startswith(f"Resumed job {mine}: next ")
        assert resumed["jobs"][0]["status"] == "active"
        for refused in (
            {"type": "job", "action": "pause", "id": other},  # another conversation's
            {"type": "job", "action": "snooze", "id": mine},
        ):
            assert (await _ask(ws, refused))["type"] == "error"
        ran = await _ask(ws, {"type": "job", "action": "run_now", "id": mine})
        assert ran["done"].startswith(f"Job {mine} runs now (it answers in conversation 's')")
        # The serve's scheduler was told: the run streams to this page at once (its every-1d
        # schedule is not due), as an ordinary fire.
        seen = await ws_until(ws, "turn_end")
        assert any(e.get("text") == "Feed checked." for e in seen if e["type"] == "delta")
    store = Store(Settings.load().paths.db)
    try:
        (run,) = js.runs(store, mine)
        assert (run.status, run.detail) == ("done", js.RUN_NOW)
        assert js.get_job(store, mine).status == "active"
    finally:
        store.close()
