"""What a person and a serve see when the store cannot be reached (the database restarting):
the AgentLoop tells the sender its turn could not start and goes on with the next message; a
failed background service is started again; a poll that keeps failing is logged once; and
`heron run` claims its message is saved only when it knows. The PostgreSQL restart itself is
tests/test_pg_restart.py."""

from __future__ import annotations

import asyncio
import io
import logging
import signal

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import Dispatcher, InboundMessage, MessageBus, Outbound, TurnEnd, TurnEvent
from heron.channels.script import ReplyPrinter, _said
from heron.config import Settings
from heron.errors import FailureLog, StoreUnreachable
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.serve import runtime
from heron.tools.registry import ToolRegistry


async def test_a_message_whose_turn_cannot_start_is_told_and_the_loop_goes_on(heron_home):
    async def answer(request: ChatRequest) -> Reply:
        return Reply([Text("ok")], "done", Usage(1, 1))

    bus, seen = MessageBus(), []
    dispatcher = Dispatcher(bus)

    async def deliver(item: Outbound) -> None:
        seen.append(item)

    dispatcher.register("test", deliver)
    async with Engine.open(
        Settings.load(), provider=ScriptedProvider(answer), registry=ToolRegistry([])
    ) as engine:
        loop = AgentLoop(engine, bus)
        down = [True]

        def options_for(key, message):  # what reads the store as a turn starts (goals)
            if down[0]:
                raise StoreUnreachable("the database cannot be reached", hint="Try again.")
            return message.options

        loop.options_for = options_for
        tasks = [asyncio.create_task(dispatcher.run()), asyncio.create_task(loop.run())]
        try:
            await bus.publish(InboundMessage("test", "c", "first", events=True))
            await _until(lambda: _ends(seen))
            down[0] = False
            await bus.publish(InboundMessage("test", "c", "second", events=True))
            await _until(lambda: len(_ends(seen)) == 2)
        finally:
            for task in tasks:
                task.cancel()
    first, second = _ends(seen)
    assert not first.ok and first.unsaved and "cannot be reached" in (first.error or "")
    assert next(e.kind for e in seen if isinstance(e, TurnEvent)) == "turn_start"
    assert second.ok


def _ends(seen: list[Outbound]) -> list[TurnEnd]:
    return [e.end for e in seen if isinstance(e, TurnEvent) and e.kind == "turn_end" and e.end]


async def _until(done, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not done():
            await asyncio.sleep(0.01)


async def test_a_background_service_that_fails_is_started_again(monkeypatch):
    monkeypatch.setattr(runtime, "SERVICE_RETRY_S", 0.01)
    runs: list[int] = []

    async def service(loop) -> None:
        runs.append(1)
        if len(runs) < 3:
            raise StoreUnreachable("the database cannot be reached")

    await asyncio.wait_for(runtime._guard(service, None), 10)
    assert len(runs) == 3  # failed twice, then ran to its end


def test_a_failure_that_repeats_is_logged_once_until_it_works_again(caplog):
    log = logging.getLogger("heron.test.failures")
    failures = FailureLog(log, "reading the leases")
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(5):
            try:
                raise StoreUnreachable("down")
            except StoreUnreachable:
                failures.failed()
        failures.worked()
        failures.worked()
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "reading the leases failed (said once: tried again until it works)",
        "reading the leases works again",
    ]


def _printer() -> tuple[ReplyPrinter, io.StringIO]:
    err = io.StringIO()
    printer = ReplyPrinter(io.StringIO(), err, key="k", served=True)
    printer.sent = True
    return printer, err


def test_a_run_cut_before_its_message_was_said_stored_does_not_claim_it_is_saved():
    printer, err = _printer()
    printer.signal, printer.cut_short = signal.SIGTERM, True
    _said(printer, "k")
    assert "is saved" not in err.getvalue()
    assert "may not be saved" in err.getvalue()
    assert "heron conversations show k" in err.getvalue()


def test_a_run_whose_message_was_stored_says_so_when_cut():
    printer, err = _printer()
    printer.event(TurnEvent("script", "s", "k", "turn_start", message_id=7))
    printer.signal, printer.cut_short = signal.SIGTERM, True
    _said(printer, "k")
    assert "Your message is saved in conversation 'k'" in err.getvalue()


def test_a_serve_stopped_before_a_workers_turn_ended_is_not_called_a_failure():
    printer, err = _printer()
    printer.event(TurnEvent("script", "s", "k", "turn_start", message_id=7))
    printer.serve_gone = printer.workers = True  # a face with workers (docs/scale.md)
    assert _said(printer, "k") is False
    said = err.getvalue()
    assert "failed" not in said and "it was stopped" not in said
    assert "may still finish" in said and "heron conversations show k" in said


def test_no_worker_log_line_repeats_the_prefix_its_handler_adds():
    """`heron worker PID: ` is the handler's prefix (heron/scale/worker.py `_log_to_stderr`);
    a message that starts with it again read `heron worker 13253: heron worker: ...`."""
    import re
    from pathlib import Path

    import heron.scale

    folder = Path(heron.scale.__file__).parent
    said = [
        m for f in folder.glob("*.py") for m in re.findall(r'log\.\w+\(\s*"([^"]*)', f.read_text())
    ]
    assert said and not [m for m in said if m.startswith("heron worker")]
