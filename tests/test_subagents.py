"""Subagents: a result answered in the running turn or in an announce turn of its own, exactly
once (also across a restart), a timed-out one returning partial work, ceilings and tools of
its own, lineages resumed and kept out of the conversation listings."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from proactive_helpers import (
    FakeSleep,
    Routed,
    call,
    last_user_text,
    note,
    running_loop,
    spawns_then_answers,
    text,
    tools,
)

from heron.agent.turn import STOPPED
from heron.bus import InboundMessage
from heron.messages import Message, Reply, Text
from heron.proactive import subagents as sa
from heron.store import runs
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry, tool

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")


async def settle(loop, manager: sa.Subagents) -> None:
    """Until the loop is idle and every announcement is settled (no timing involved)."""
    while True:
        await loop.wait_idle()
        pending = [t for t in manager.tasks.values() if not t.done()] + list(manager._settling)
        if not pending and not loop._active:
            return
        await asyncio.gather(*pending, return_exceptions=True)


def result_rows(engine, key: str) -> list:
    conv = engine.store.conversation(key)
    rows = engine.store.branch(conv.id)
    return [r for r in rows if r.meta.get(runs.RUN_META)]


async def test_result_opens_an_announce_turn_when_the_origin_is_idle():
    model = Routed({"test:": spawns_then_answers, "subagent:": lambda r, n: text("42")})
    async with running_loop(model, tools()) as (engine, loop, said):
        manager = sa.attach(loop)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "work it out"))
        await settle(loop, manager)
        (run,) = runs.listing(engine.store)
        rows = result_rows(engine, "test:me")
        conversations = [c.key for c in engine.store.conversations()]
        task_row = engine.store.branch(engine.store.conversation(run.conversation_key).id)[0]

    assert [o.text for o in said if o.kind == "answer"] == [
        "I asked a subagent.",
        "The subagent says 42.",
    ]
    assert run.status == "done" and run.result == "42" and not run.partial
    assert run.announced is not None
    assert len(rows) == 1 and rows[0].author == "heron" and rows[0].message.role == "user"
    assert "42" in rows[0].message.text
    assert all(not k.startswith("subagent:") for k in conversations)  # never listed
    assert task_row.author == "heron"  # the main agent's words, never quoted as the person's
    sub = model.seen[run.conversation_key][0]
    assert [m.role for m in sub.messages] == ["user"]  # bare: only its task
    assert {t.name for t in sub.tools} == {"note"}  # no spawn, ask_user, goal, message


async def test_result_goes_into_the_running_turns_mailbox():
    def origin(request, n):
        if n == 1:
            return call("spawn", task="Find the answer.")
        if n == 2:
            return call("hold", n=2)
        assert "[Subagent result" in last_user_text(request)
        return text("Got it: 42.")

    model = Routed({"test:": origin, "subagent:": lambda r, n: text("42")})
    holder: dict[str, sa.Subagents] = {}

    @tool
    async def hold(ctx: ToolContext) -> str:
        """Wait for the subagent."""
        manager = holder["m"]
        await asyncio.gather(*manager.tasks.values())  # finished and injected
        return "waited"

    async with running_loop(model, ToolRegistry([note, hold])) as (engine, loop, said):
        manager = holder["m"] = sa.attach(loop)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "go"))
        await settle(loop, manager)
        (run,) = runs.listing(engine.store)
        rows = result_rows(engine, "test:me")
        turns = engine.store.turns(engine.store.conversation("test:me").id)

    assert [o.text for o in said if o.kind == "answer"] == ["Got it: 42."]
    assert len(turns) == 1  # answered in the running turn, no announce turn
    assert len(rows) == 1 and rows[0].author == "heron"
    assert run.announced is not None


async def test_a_timed_out_subagent_returns_its_partial_work():
    clock = FakeSleep()
    never = asyncio.Event()

    async def sub(request, n):
        if n == 1:
            return call("note", what="the config lives in /etc/app.toml")
        clock.fire.set()  # it is working on its second step when the clock runs out
        await never.wait()
        raise AssertionError("not reached")

    def origin(request, n):
        if n == 1:
            return call("spawn", task="Find the config.")
        if n == 2:
            return text("Started.")
        return text("It timed out, but found /etc/app.toml.")

    model = Routed({"test:": origin, "subagent:": sub})
    async with running_loop(model, tools()) as (engine, loop, said):
        manager = sa.attach(loop, sleep=clock, timeout_s=30)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "find it"))
        await settle(loop, manager)
        (run,) = runs.listing(engine.store)
        (row,) = result_rows(engine, "test:me")

    assert clock.asked == [30]
    assert run.status == "timed_out" and run.partial
    assert "/etc/app.toml" in run.result
    assert "timed out" in row.message.text and "partial" in row.message.text
    assert said[-1].text == "It timed out, but found /etc/app.toml."


async def test_ceilings_of_its_own():
    def sub(request, n):
        return call("note", n=n, what=f"step {n}") if n <= 2 else text("summary so far")

    def origin(request, n):
        return call("spawn", task="Loop.") if n == 1 else text("ok")

    model = Routed({"test:": origin, "subagent:": sub})
    async with running_loop(model, tools()) as (engine, loop, _):
        manager = sa.attach(loop, max_model_calls=2)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "go"))
        await settle(loop, manager)
        (run,) = runs.listing(engine.store)
    sub_calls = model.seen[run.conversation_key]
    assert len(sub_calls) == 3  # two calls, then the wrap-up
    assert run.status == "done" and run.partial and run.result == "summary so far"


async def test_at_most_four_at_once():
    gate = asyncio.Event()
    inflight, peak = [0], [0]

    async def sub(request, n):
        inflight[0] += 1
        peak[0] = max(peak[0], inflight[0])
        if inflight[0] == 4:
            gate.set()
        await gate.wait()
        inflight[0] -= 1
        return text("done")

    def origin(request, n):
        return text("ok")

    model = Routed({"test:": origin, "subagent:": sub})
    async with running_loop(model, tools()) as (engine, loop, _):
        manager = sa.attach(loop)
        await manager.start()
        for i in range(6):
            await manager.spawn("test:me", f"task {i}")
        await settle(loop, manager)
        done = runs.listing(engine.store)
    assert peak[0] == 4
    assert len(done) == 6 and {r.status for r in done} == {"done"}


async def test_a_finished_lineage_is_resumed_with_its_history():
    def sub(request, n):
        return text("first") if n == 1 else text(f"second, after {len(request.messages)} msgs")

    model = Routed({"test:": lambda r, n: text("ok"), "subagent:": sub})
    async with running_loop(model, tools()) as (engine, loop, _):
        manager = sa.attach(loop)
        await manager.start()
        run = await manager.spawn("test:me", "part one")
        await settle(loop, manager)
        again = await manager.spawn("test:me", "part two", resume=run.lineage)
        await settle(loop, manager)
        final = runs.get(engine.store, again.id)
    assert again.id == run.id
    assert final.result == "second, after 3 msgs"  # task, answer, new task


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


async def test_restart_marks_running_interrupted_and_announces_exactly_once():
    model = Routed(
        {"test:": lambda r, n: text(f"announce {n}"), "subagent:": lambda r, n: text("x")}
    )
    async with running_loop(model, tools()) as (engine, loop, said):
        store = engine.store
        store.open_conversation("test:me")
        lost = runs.create(
            store,
            "sa_lost",
            "subagent",
            "test:me",
            "t",
            status="running",
            lineage="l1",
            origin_channel="test",
            origin_chat="me",
        )
        with store.transaction() as c:  # a process that died while it ran
            c.execute("UPDATE runs SET pid = ? WHERE id = ?", (_dead_pid(), lost.id))
        manager = sa.attach(loop)
        await manager.start()
        await settle(loop, manager)
        first = runs.get(store, lost.id)
        await loop.close()
        # A second start (another restart) announces nothing again.
        again = sa.Subagents(loop)
        await again.start()
        await settle(loop, again)
        rows = result_rows(engine, "test:me")
    assert first.status == "interrupted" and first.partial and first.announced is not None
    assert len(rows) == 1 and "interrupted" in rows[0].message.text
    assert [o.text for o in said if o.kind == "answer"] == ["announce 1"]


async def test_a_result_already_in_the_record_is_not_announced_again():
    """The crash came after the announce turn stored the result, before it was marked."""
    model = Routed({"test:": lambda r, n: text("should not run")})
    async with running_loop(model, tools()) as (engine, loop, said):
        store = engine.store
        conv = store.open_conversation("test:me")
        run = runs.create(
            store,
            "sa_done",
            "subagent",
            "test:me",
            "t",
            status="running",
            lineage="l2",
            origin_channel="test",
            origin_chat="me",
        )
        runs.finish(store, run.id, "done", "42")
        from heron.agent.turn import Injected

        store.append(
            conv.id,
            Injected("result", {"subagent": True, runs.RUN_META: run.id}),
            meta={"subagent": True, runs.RUN_META: run.id},
        )
        store.append(conv.id, Message("assistant", [Text("It says 42.")]))  # answered, too
        manager = sa.attach(loop)
        await manager.start()
        await settle(loop, manager)
        marked = runs.get(store, run.id)
    assert marked.announced is not None
    assert said == [] and "test:me" not in model.seen


async def test_a_result_stored_but_never_answered_is_answered_by_exactly_one_retry():
    """The crash came after the announce turn stored the result, before its reply: one turn
    answers it at the next start, and no later start answers it again."""
    model = Routed({"test:": lambda r, n: text(f"answered {n}")})
    async with running_loop(model, tools()) as (engine, loop, said):
        store = engine.store
        conv = store.open_conversation("test:me")
        run = runs.create(
            store, "sa_cut", "subagent", "test:me", "t", status="running", lineage="l3",
            origin_channel="test", origin_chat="me",
        )  # fmt: skip
        runs.finish(store, run.id, "done", "42")
        from heron.agent.turn import Injected

        meta = {"subagent": True, runs.RUN_META: run.id}
        store.append(conv.id, Injected("result", meta), meta=meta)
        manager = sa.attach(loop)
        await manager.start()
        await settle(loop, manager)
        marked = runs.get(store, run.id)
        with store.transaction() as c:  # as if it crashed again before the mark
            c.execute("UPDATE runs SET announced = NULL WHERE id = ?", (run.id,))
        await manager.close()
        again = sa.attach(loop)
        await again.start()
        await settle(loop, again)
        rows = store.branch(conv.id)
    assert marked.announced is not None
    assert [o.text for o in said if o.kind == "answer"] == ["answered 1"]  # once, not twice
    retries = [r for r in rows if r.meta.get(sa.RETRY_META) == run.id]
    assert len(retries) == 1 and "sa_cut" in retries[0].message.text
    assert len(model.seen["test:me"]) == 1
    assert "[Subagent result" not in retries[0].message.text  # the result is not repeated


# A serve-like process: the subagent finishes, its announce turn stores the result and then
# hangs in the model call, where the parent kills the process with SIGKILL.
CHILD = r"""
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from proactive_helpers import Routed, call, text, running_loop
from heron.bus import InboundMessage
from heron.proactive import subagents as sa
from heron.tools.registry import ToolRegistry
import test_subagents as t

MODE = sys.argv[2]

async def announce_turn(request, n):
    if n == 1:
        return call("spawn", task="compute")
    if n == 2:
        return text("started")
    print("announcing", flush=True)  # the result is in the record: the turn is on the wire
    await asyncio.Event().wait()

async def working(request, n):
    if n == 1:
        return call("note", what="half of it: 21")
    print("working", flush=True)  # the subagent is mid-task
    await asyncio.Event().wait()

async def main():
    sub = working if MODE == "working" else (lambda r, n: text("42"))
    model = Routed({"test:": announce_turn, "subagent:": sub})
    async with running_loop(model, t.tools()) as (engine, loop, said):
        manager = sa.attach(loop)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "go"))
        await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.slow  # a real process, killed with SIGKILL
async def test_announced_exactly_once_across_a_sigkill(heron_home):
    tests_dir = str(Path(__file__).parent)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, tests_dir, "announcing"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HERON_HOME": str(heron_home)},
    )
    try:
        line = await asyncio.to_thread(child.stdout.readline)
        assert line.strip() == "announcing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    model = Routed({"test:": lambda r, n: text(f"answered {n}")})
    async with running_loop(model, tools()) as (engine, loop, said):
        (before,) = runs.listing(engine.store)
        manager = sa.attach(loop)
        await manager.start()
        await settle(loop, manager)
        await loop.dispatch(InboundMessage("test", "me", "and now?"))
        await settle(loop, manager)
        (after,) = runs.listing(engine.store)
        rows = result_rows(engine, "test:me")
        history = model.seen["test:me"][-1].messages
    assert before.status == "done" and before.announced is None  # killed before the mark
    assert after.announced is not None
    assert len(rows) == 1  # not announced a second time
    # The interrupted announce turn gets its reply: one retry turn at start, then the user's.
    assert [o.text for o in said if o.kind == "answer"] == ["answered 1", "answered 2"]
    assert sum("[Subagent result" in m.text for m in history) == 1  # the model sees it, once
    assert sum("was interrupted before it was answered" in m.text for m in history) == 1


async def test_runs_cli_lists_shows_a_transcript_and_cancels():
    from typer.testing import CliRunner

    from heron.cli import app

    model = Routed({"test:": lambda r, n: text("ok"), "subagent:": lambda r, n: text("found 7")})
    async with running_loop(model, tools()) as (engine, loop, _):
        manager = sa.attach(loop)
        await manager.start()
        run = await manager.spawn("test:me", "count the files")
        await settle(loop, manager)
        waiting = runs.create(
            engine.store, "ask_1", "ask", "test:me", "Which one?", status="waiting"
        )
    cli = CliRunner()
    listed = cli.invoke(app, ["runs", "list"])
    shown = cli.invoke(app, ["runs", "show", run.id[:6]])
    conversations = cli.invoke(app, ["conversations", "list"])
    cancelled = cli.invoke(app, ["runs", "cancel", waiting.id])
    again = cli.invoke(app, ["runs", "cancel", waiting.id])
    missing = cli.invoke(app, ["runs", "show", "nope"])
    assert run.id in listed.output and "ask_1" in listed.output and "waiting" in listed.output
    assert "count the files" in shown.output and "assistant: found 7" in shown.output
    assert "subagent:" not in conversations.output and "test:me" in conversations.output
    assert cancelled.exit_code == 0 and "Cancelled ask ask_1" in cancelled.output
    assert "already ended (cancelled)" in again.output
    assert missing.exit_code == 1 and "heron runs list" in missing.output


async def test_a_one_message_run_waits_for_its_subagents_result():
    """`heron run`'s connection settles only once the subagent reported back."""
    from heron.agent.engine import Engine
    from heron.channels.inprocess import connect
    from heron.config import Settings
    from heron.providers.scripted import ScriptedProvider

    def origin(request, n):
        if n == 1:
            return call("spawn", task="Compute it.")
        return text("Started." if n == 2 else "The answer is 42.")

    model = Routed({"script:": origin, "subagent:": lambda r, n: text("42")})
    got: list[str] = []

    async def deliver(item) -> None:
        if getattr(item, "kind", None) == "answer":
            got.append(item.text)

    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(model), registry=tools()
    ) as e:
        async with connect(e, "script", "one", deliver, idle=False) as agent:
            await agent.send("work", "script:one")
            await agent.settle()
        (run,) = runs.listing(e.store)
    assert got == ["Started.", "The answer is 42."]
    assert run.status == "done" and run.announced is not None


async def test_a_subagent_of_internal_work_reports_silently():
    def origin(request, n):
        if n == 1:
            return call("spawn", task="Check the feed.")
        return text("nothing new" if n == 3 else "started")

    model = Routed({"cron:": origin, "subagent:": lambda r, n: text("no changes")})
    async with running_loop(model, tools()) as (engine, loop, said):
        manager = sa.attach(loop)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "job", "tick", "cron:7", provenance="scheduled"))
        await settle(loop, manager)
        (run,) = runs.listing(engine.store)
        rows = result_rows(engine, "cron:7")
    assert run.origin_internal and run.announced is not None
    assert len(rows) == 1 and len(model.seen["cron:7"]) == 3  # answered in a turn of its own
    assert said == []  # silent: nothing reaches the person unless `message` is called


@tool
async def other(ctx: ToolContext) -> str:
    """Another tool."""
    return "x"


async def test_a_tool_subset_is_checked_and_kept():
    def origin(request, n):
        if n == 1:
            return call("spawn", task="x", tools=["spawn", "nope"])
        if n == 2:
            return call("spawn", n=2, task="Only notes.", tools=["note"])
        return text("ok")

    model = Routed({"test:": origin, "subagent:": lambda r, n: text("done")})
    async with running_loop(model, ToolRegistry([note, other])) as (engine, loop, _):
        manager = sa.attach(loop)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "go"))
        await settle(loop, manager)
        (run,) = runs.listing(engine.store)
    refused = model.seen["test:me"][1].messages[-1].parts[0]
    assert refused.is_error and "cannot have nope, spawn" in refused.content
    assert run.tools == ["note"]
    assert {t.name for t in model.seen[run.conversation_key][0].tools} == {"note"}


@pytest.mark.slow  # a real process, killed with SIGKILL while its subagent works
async def test_a_subagent_killed_mid_task_reports_its_partial_work_once(heron_home):
    tests_dir = str(Path(__file__).parent)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, tests_dir, "working"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HERON_HOME": str(heron_home)},
    )
    try:
        line = await asyncio.to_thread(child.stdout.readline)
        assert line.strip() == "working"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    model = Routed({"test:": lambda r, n: text(f"answered {n}")})
    async with running_loop(model, tools()) as (engine, loop, said):
        (before,) = runs.listing(engine.store)
        for _ in range(2):  # two restarts: announced by the first only
            manager = sa.attach(loop, channel=("test", "me"))
            await manager.start()
            await settle(loop, manager)
            await manager.close()
        (after,) = runs.listing(engine.store)
        rows = result_rows(engine, "test:me")
    assert before.status == "running"  # what the dead process left
    assert after.status == "interrupted" and after.partial and "half of it: 21" in after.result
    assert len(rows) == 1 and "interrupted" in rows[0].message.text
    assert [o.text for o in said if o.kind == "answer"] == ["answered 1"]


async def test_an_announce_turn_that_fails_on_a_model_error_is_retried_once_at_once():
    """The announce turn ends on a model error (ok False, not an exception): one more turn
    answers the result at once, and the run is marked announced only once it is answered."""
    from heron.errors import ProviderError

    def origin(request, n):
        if n <= 2:
            return spawns_then_answers(request, n)
        if n == 3:  # the announce turn: the provider is down at that moment
            raise ProviderError("the model is down")
        assert "was interrupted before it was answered" in last_user_text(request)
        return text("The subagent says 42 (retried).")

    model = Routed({"test:": origin, "subagent:": lambda r, n: text("42")})
    async with running_loop(model, tools()) as (engine, loop, said):
        manager = sa.attach(loop)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "work it out"))
        await settle(loop, manager)
        (run,) = runs.listing(engine.store)
        rows = engine.store.branch(engine.store.conversation("test:me").id)
    answers = [o.text for o in said if o.kind == "answer"]
    assert answers[-1] == "The subagent says 42 (retried)."
    assert len([r for r in rows if r.meta.get(sa.RETRY_META) == run.id]) == 1
    assert run.announced is not None


async def test_a_result_whose_retry_fails_too_stays_owed_until_a_turn_answers_it():
    """The announce turn and its one retry both fail on a model error: no third turn, and the
    run is not marked announced; the person's next turn, which answers it, settles it."""
    from heron.errors import ProviderError

    def origin(request, n):
        if n <= 2:
            return spawns_then_answers(request, n)
        if n in (3, 4):
            raise ProviderError("the model is down")
        return text("Back: the subagent says 42.")

    model = Routed({"test:": origin, "subagent:": lambda r, n: text("42")})
    async with running_loop(model, tools()) as (engine, loop, _said):
        manager = sa.attach(loop)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "work it out"))
        await settle(loop, manager)
        (run,) = runs.listing(engine.store)
        calls = len(model.seen["test:me"])
        again = sa.attach(loop)  # a later start: still owed, no second retry
        await again.start()
        await settle(loop, again)
        (restarted,) = runs.listing(engine.store)
        calls_after_start = len(model.seen["test:me"])
        await loop.dispatch(InboundMessage("test", "me", "and?"))
        await settle(loop, manager)
        (answered,) = runs.listing(engine.store)
    assert calls == 4 and run.announced is None
    assert calls_after_start == 4 and restarted.announced is None
    assert answered.announced is not None


async def test_a_subagent_waiting_for_a_slot_is_shown_waiting_until_it_starts():
    """At most `max_parallel` run: the others' rows say waiting (with their place in line,
    no clock) until they start; one cancelled while it waits never runs."""
    import time

    from typer.testing import CliRunner

    from heron.cli import app

    gate = asyncio.Event()

    async def sub(request, n):
        await gate.wait()
        return text("done")

    model = Routed({"test:": lambda r, n: text("ok"), "subagent:": sub})
    async with running_loop(model, tools()) as (engine, loop, _said):
        store = engine.store
        manager = sa.attach(loop, max_parallel=1)
        await manager.start()
        first = await manager.spawn("test:me", "first task")
        second = await manager.spawn("test:me", "second task")
        third = await manager.spawn("test:me", "third task")
        while first.conversation_key not in model.seen:
            await asyncio.sleep(0)
        before = {r.id: r for r in runs.listing(store)}
        lines = runs.status_lines(store, "test:me", time.time(), "UTC")
        listed = CliRunner().invoke(app, ["runs", "list"]).output.splitlines()
        dropped = runs.cancel_by_person(store, before[third.id])
        gate.set()
        await settle(loop, manager)
        after = {r.id: r for r in runs.listing(store)}
    assert before[first.id].status == "running"
    assert before[second.id].status == before[third.id].status == "waiting"
    assert f"subagent {second.id}: waiting for a slot (1st in line): second task" in lines
    assert f"subagent {third.id}: waiting for a slot (2nd in line): third task" in lines
    (line,) = [x for x in listed if x.startswith(second.id)]
    assert "waiting for a slot (1st in line)" in line and " - " in line  # not started
    assert "running" in next(x for x in listed if x.startswith(first.id))
    assert dropped == (True, f"Cancelled subagent {third.id}.")
    assert after[second.id].status == "done" and after[second.id].created > second.created
    assert after[third.id].status == "cancelled" and third.conversation_key not in model.seen


async def test_a_stop_while_waiting_on_a_subagent_keeps_its_slot_row_and_result():
    """/stop of a turn waiting on spawn(wait=true): the subagent goes on in its slot (no fifth
    one runs beside it), its row ends done, and its result reaches the conversation as an
    ordinary subagent's would, not lost with the wait that asked for it."""
    started, gate = asyncio.Event(), asyncio.Event()
    inflight, peak = [0], [0]

    async def sub(request, n):
        inflight[0] += 1
        peak[0] = max(peak[0], inflight[0])
        if "waited on" in last_user_text(request):
            started.set()
        await gate.wait()
        inflight[0] -= 1
        return text("42")

    def origin(request, n):
        if n == 1:
            return call("spawn", task="The task waited on.", wait=True)
        return text("Here is what the subagent found.")

    model = Routed({"test:": origin, "subagent:": sub})
    async with running_loop(model, tools()) as (engine, loop, _):
        manager = sa.attach(loop)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "go"))
        await started.wait()
        await loop.stop("test:me")
        while loop.running("test:me"):  # the stopped turn ends; its subagent works on
            await asyncio.sleep(0)
        for i in range(4):  # the slots left: three, so one of these waits
            await manager.spawn("test:other", f"task {i}")
        while inflight[0] < 4:
            await asyncio.sleep(0)
        gate.set()
        await settle(loop, manager)
        waited = next(r for r in runs.listing(engine.store) if "waited on" in r.task)
        rows = result_rows(engine, "test:me")

    assert peak[0] == 4  # the stopped turn's subagent kept its slot
    assert waited.status == "done" and waited.result == "42" and waited.finished is not None
    assert waited.announced is not None and len(rows) == 1 and "42" in rows[0].message.text


async def test_a_subagent_stopped_while_a_tool_runs_reports_the_calls_it_made():
    """A serve's shutdown (`close`) while the subagent's tool runs: its result names the
    calls it made and the one in flight, with what it wrote, not only that it was stopped."""
    in_tool = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext, command: str) -> str:
        """Run a long command.

        Args:
            command: The command.
        """
        in_tool.set()
        await asyncio.Event().wait()  # still running when Heron stops
        return "not reached"

    def sub(request, n):
        if n == 1:
            return call("note", what="the logs are in /var/log/app")
        reply = call("slow", n=2, command="grep -r ERROR /var/log/app")
        return Reply([Text("Looking for errors now."), *reply.parts], reply.stop, reply.usage)

    model = Routed({"test:": spawns_then_answers, "subagent:": sub})
    async with running_loop(model, ToolRegistry([note, slow])) as (engine, loop, _):
        manager = sa.attach(loop)
        await manager.start()
        await loop.dispatch(InboundMessage("test", "me", "work it out"))
        await in_tool.wait()
        await manager.close()
        (run,) = runs.listing(engine.store)

    assert run.status == "interrupted" and run.partial
    said = run.result
    assert "note(what='the logs are in /var/log/app')" in said
    assert "Looking for errors now." in said
    assert "slow(command='grep -r ERROR /var/log/app') was running when it was stopped" in said
    assert STOPPED not in said
