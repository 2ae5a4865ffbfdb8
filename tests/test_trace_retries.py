"""A model call retried after a failed attempt (a 529, then a success): `trace ls` counted two
calls while `trace show` had one line with no error and `trace export` no record of the 529
(QA22x L2). Each failed attempt is now in the trace with its error and the wait before the
next, shown under its call and exported with it."""

from __future__ import annotations

import json

from heron.agent.engine import Engine
from heron.config import Settings
from heron.errors import Overloaded
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.trace.prices import PriceTable
from heron.trace.read import load_run
from heron.trace.render import export_run, render_show
from heron.trace.scrub import Scrubber


def overloaded_once() -> ScriptedProvider:
    asked: list[int] = []

    def answer(request: ChatRequest) -> Reply:
        asked.append(1)
        if len(asked) == 1:  # retry_after 0: no wait in the test
            raise Overloaded("HTTP 529: overloaded_error", status=529, retry_after=0)
        return Reply([Text("second")], "done", Usage(10, 2))

    return ScriptedProvider(answer)


async def test_a_retried_call_shows_and_exports_its_failed_attempt() -> None:
    async with Engine.open(Settings.load(), provider=overloaded_once()) as engine:
        result = await engine.turn("r", "again")
        run = load_run(engine.store, result.run_id)
        shown = list(render_show(engine.store, run, PriceTable(), "UTC"))
        exported = json.loads(export_run(engine.store, result.run_id, Scrubber()))
    assert result.ok and result.reply == "second"
    assert run.turn.model_calls == 2  # every attempt sent counts
    assert [c.seq for c in run.calls] == [1]
    call_line = next(i for i, line in enumerate(shown) if line.startswith("  #1 turn"))
    assert "2 attempts" in shown[call_line]
    attempt = shown[call_line + 1]
    assert attempt.startswith("    attempt 1 ✗ Overloaded(") and "529" in attempt
    assert "tried again after 0.0s" in attempt
    (call,) = exported["model_calls"]
    (failed,) = call["failed_attempts"]
    assert failed["attempt"] == 1 and "529" in failed["error"] and failed["wait"] == 0
    assert not [e for e in exported["events"] if e["kind"] == "retry"]  # with its call
