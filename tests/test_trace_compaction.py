"""Traces and compaction together: every summary and checkpoint call is recorded (and paid for
by its turn), and a scripted session with tools, an in-flight compaction, a consolidation and an
interruption replays with identical requests; a changed compaction prompt is reported at the
request and part where it shows."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from compaction_helpers import Model, is_checkpoint, is_summary, report_registry

from heron.agent.control import TurnControl
from heron.agent.engine import Engine, TurnHooks
from heron.agent.replay import replay
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.store import compactions as folds
from heron.trace.read import list_runs, load_run, request_payload

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")


class Session:
    """The scripted model of the session: `Model`, with a summarizer that reports usage and a
    switch that makes the next tool round hang until the test cancels the turn."""

    def __init__(self) -> None:
        self.model = Model(
            tool="fetch_report",
            args={"n": 1},
            tool_rounds=24,
            summarize=lambda r: Reply(
                [Text("## Facts\nreports were read")], "done", Usage(700, 30)
            ),
            checkpoint="## Request\nread the reports\n## Current step\nround 20",
        )
        self.hang = False
        self.hanging = asyncio.Event()

    async def __call__(self, request: ChatRequest) -> Reply:
        compaction = is_summary(request) or is_checkpoint(request)
        if self.hang and not compaction and request.messages[-1].tool_results:
            self.hanging.set()
            await asyncio.Event().wait()  # the user interrupts while this call is out
        return self.model(request)


async def _record_session(engine: Engine, session: Session) -> None:
    await engine.turn("k", "read report 1 again and again")  # fills the window: in flight
    session.model.tool_rounds = 1
    # A smaller window from now on (a replay uses the recorded one, not the settings): the next
    # turns start past their share of it, so BUILD consolidates.
    env = {**engine.settings.env, "HERON_CONTEXT_WINDOW": "2400"}
    engine.settings = dataclasses.replace(engine.settings, env=env)
    for i in range(4):
        await engine.turn("k", f"once more, round {i}")
    session.hang = True
    task = asyncio.create_task(engine.turn("k", "one last time"))
    await session.hanging.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.fixture
def small_window(monkeypatch):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "8000")


async def test_compaction_calls_are_recorded_and_the_session_replays_identically(small_window):
    session = Session()
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(session), registry=report_registry()
    ) as engine:
        await _record_session(engine, session)
        runs = [load_run(engine.store, r.run_id) for r in reversed(list_runs(engine.store, "k"))]
        conv = engine.store.conversation("k")
        kinds = [c.kind for c in folds.compactions(engine.store, conv.id)]
        reports = [
            await replay(engine.store, r.turn.run_id, registry=report_registry()) for r in runs
        ]
    assert "inflight" in kinds and "consolidation" in kinds
    purposes = [[c.purpose for c in r.calls] for r in runs]
    assert "checkpoint" in purposes[0]
    with_summary = [i for i, p in enumerate(purposes) if "summary" in p]
    assert with_summary and purposes[with_summary[0]][0] == "summary"  # at BUILD, before RUN
    # The turn pays for its summary: the summarizer reported 700 input tokens.
    summarized = runs[with_summary[0]].turn
    assert summarized.usage.input >= 700 and summarized.model_calls == len(
        runs[with_summary[0]].calls
    )
    # seq numbers every call of the turn in the order made, compaction's included.
    for r in runs:
        assert [c.seq for c in r.calls] == list(range(1, len(r.calls) + 1))
    assert runs[-1].turn.status == "interrupted"
    for run, report in zip(runs, reports, strict=True):
        assert report.identical, report.render()
        assert report.replayed_requests == len(run.calls)
    assert reports[-1].replayed_stop == "interrupted"


async def test_a_changed_summary_prompt_is_reported_at_the_summary_request(
    small_window, monkeypatch
):
    session = Session()
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(session), registry=report_registry()
    ) as engine:
        await _record_session(engine, session)
        runs = [load_run(engine.store, r.run_id) for r in reversed(list_runs(engine.store, "k"))]
        target = next(r for r in runs if any(c.purpose == "summary" for c in r.calls))
        index = next(i for i, c in enumerate(target.calls) if c.purpose == "summary")
        # A deliberate change in how the summarizer is asked.
        import heron.compaction.consolidate as consolidate

        monkeypatch.setattr(consolidate, "SUMMARY_SYSTEM", consolidate.SUMMARY_SYSTEM + " Terse.")
        report = await replay(engine.store, target.turn.run_id, registry=report_registry())
    assert not report.identical
    number, diff = report.first
    assert number == index + 1 and diff.path == ("system",)
    assert "Terse." in report.render()
    # The summary itself is served from the trace: nothing after it differs.
    assert report.differing_requests == 1


async def test_a_changed_checkpoint_instruction_is_reported_at_its_message_and_part(
    small_window, monkeypatch
):
    session = Session()
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(session), registry=report_registry()
    ) as engine:
        result = await engine.turn("k", "read report 1 again and again")
        run = load_run(engine.store, result.run_id)
        index = next(i for i, c in enumerate(run.calls) if c.purpose == "checkpoint")
        import heron.compaction.governor as governor

        monkeypatch.setattr(
            governor, "CHECKPOINT_INSTRUCTION", governor.CHECKPOINT_INSTRUCTION + " Terse."
        )
        report = await replay(engine.store, result.run_id, registry=report_registry())
    number, diff = report.first
    assert number == index + 1
    assert diff.path[0] == "messages" and diff.path[2:3] == ("parts",)
    assert "Terse." in report.render() and report.differing_requests == 1


async def test_mail_a_checkpoint_quotes_by_its_row_replays_identically(small_window):
    """Mail typed during a long turn rides in a tool-result row that the turn's checkpoints
    quote by id ([#N]): the replay writes the run's rows with the ids the run gave them."""
    session, control = Session(), TurnControl("mail")
    rounds = 0

    async def model(request: ChatRequest) -> Reply:
        nonlocal rounds
        if not (is_summary(request) or is_checkpoint(request)):
            rounds += 1
            if rounds == 2:  # typed while the second call is out
                control.mailbox.post("MIDTURN: also tag everything with LABEL-ORCA-5")
        return await session(request)

    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(model), registry=report_registry()
    ) as engine:
        result = await engine.turn(
            "mail", "read report 1 again and again", TurnHooks(control=control)
        )
        run = load_run(engine.store, result.run_id)
        conv = engine.store.conversation("mail")
        mailed = next(r for r in engine.store.branch(conv.id) if "LABEL-ORCA-5" in r.message.text)
        checkpoint = next(i for i, c in enumerate(run.calls) if c.purpose == "checkpoint")
        after = request_payload(engine.store, run.calls[checkpoint + 1])
        report = await replay(engine.store, result.run_id, registry=report_registry())
    assert ("injection", 2) in [(e.kind, e.after_call) for e in run.events]
    # The request after the checkpoint quotes the mail by its row.
    assert f"[#{mailed.id}] [sent while you were working] MIDTURN" in after
    assert report.identical, report.render()
    assert report.replayed_requests == len(run.calls)


async def test_a_consolidation_that_fell_back_replays_identically(small_window):
    """The third turn in a row whose summary fails writes the fallback; its replay writes the
    same fallback (the failed turns it found are in its trace), and so do the failed turns'."""
    session = Session()
    session.model.summarize = lambda r: Reply([Text("")], "done", Usage(700, 0))
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(session), registry=report_registry()
    ) as engine:
        await engine.turn("fb", "read report 1 again and again")
        session.model.tool_rounds = 1
        env = {**engine.settings.env, "HERON_CONTEXT_WINDOW": "2400"}
        engine.settings = dataclasses.replace(engine.settings, env=env)
        for i in range(8):
            await engine.turn("fb", f"once more, round {i}")
        runs = [load_run(engine.store, r.run_id) for r in reversed(list_runs(engine.store, "fb"))]
        conv = engine.store.conversation("fb")
        kinds = [c.kind for c in folds.compactions(engine.store, conv.id)]
        reports = [
            await replay(engine.store, r.turn.run_id, registry=report_registry()) for r in runs
        ]
    assert "fallback" in kinds
    for run, report in zip(runs, reports, strict=True):
        assert report.identical, report.render()
        assert report.replayed_requests == len(run.calls)
    # The turn that fell back found two failed turns, the last one just before it: its trace
    # says so (the first turn found none).
    found = [r.start["context"]["failed_turns"] for r in runs]
    third = next(i for i, f in enumerate(found) if f[0] == 2)
    assert found[0] == [0, None] and found[third] == [2, runs[third - 1].turn.id]
