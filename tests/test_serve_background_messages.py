"""A monitor job's `message` through `heron serve`: kept in the conversation it goes to, as
Heron's, so that a client connecting later sees it, `heron conversations show` prints it and
the model of that conversation's next turn reads it (appended: the earlier request stays its
prefix); said while a turn runs there, it is kept after that turn, never inside it; the tool
tells the job's model whether anyone saw it now."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

from proactive_helpers import call, last_user_text, text
from serve_helpers import WAIT, running_serve, ws_client, ws_hello, ws_until
from typer.testing import CliRunner
from waiting import until

from heron.agent.relay import RELAY_META
from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, ToolResult
from heron.proactive.background import run_proactive
from heron.proactive.clock import FakeClock
from heron.providers.base import ChatRequest
from heron.providers.scripted import ScriptedProvider
from heron.store import Store, StoredMessage
from heron.store import jobs as js
from heron.store.schedule import parse

START = dt.datetime(2026, 6, 1, 8, 0, tzinfo=dt.UTC).timestamp()
ALERT = "MONITOR ALERT: the build is red"
LABEL = "[Sent to the user by scheduled job {job} (a monitor), not written by the user] "


class Model:
    """The monitor's turn says ALERT with `message`; `personal` answers each message, its
    first turn held until `release` is set."""

    def __init__(self) -> None:
        self.personal: list[ChatRequest] = []
        self.told: list[str] = []  # what the `message` tool answered the monitor's model
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, request: ChatRequest) -> Reply:
        results = [p.content for p in request.messages[-1].parts if isinstance(p, ToolResult)]
        if results:
            self.told += results
            return text("Told them.")
        if "Scheduled check" in last_user_text(request):
            return call("message", text=ALERT)
        self.personal.append(request)
        if len(self.personal) == 1:
            await self.release.wait()
        return text(f"Answer {len(self.personal)}.")


def _rows(store: Store, key: str) -> list[StoredMessage]:
    conversation = store.conversation(key)
    assert conversation is not None
    return store.branch(conversation.id)


async def _fire_monitor(clock: FakeClock, store: Store) -> str:
    """A monitor job made in `personal`, fired; its label."""
    every = parse(every="1h", timezone="UTC")
    job = js.create_job(store, every, conversation="personal", prompt="Is CI green?",
                        now=START, mode="monitor")  # fmt: skip
    await clock.idle(2)
    clock.set(START + 3600)
    return LABEL.format(job=job.id)


async def _send(ws: Any, said: str) -> list[dict[str, Any]]:
    await ws.send(json.dumps({"type": "send", "text": said}))
    return await ws_until(ws, "idle")


async def test_said_while_nobody_is_connected_it_is_kept_shown_later_and_read_next_turn():
    clock, model = FakeClock(START), Model()
    services = [lambda loop: run_proactive(loop, clock=clock)]
    async with running_serve(ScriptedProvider(model), services=services) as serve:
        store = Store(Settings.load().paths.db)
        async with ws_client(serve) as ws:
            await ws_hello(ws, "personal")
            await _send(ws, "hello")
        label = await _fire_monitor(clock, store)  # nobody has `personal` open now
        await until(
            lambda: model.told and _rows(store, "personal")[-1].meta.get(RELAY_META), timeout=WAIT
        )
        assert model.told == [
            "Nobody has conversation 'personal' open now: kept in conversation 'personal',"
            " where the user sees it next."
        ]
        *_, row = _rows(store, "personal")
        assert (row.author, row.role, row.message.text) == ("heron", "user", ALERT)
        assert row.wire.text == label + ALERT and row.meta[RELAY_META].startswith("cron:")
        shown = CliRunner().invoke(app, ["conversations", "show", "personal"])
        assert shown.exit_code == 0 and ALERT in shown.output
        async with serve.http() as http:
            items = (await http.get("/api/conversations/personal/transcript")).json()["items"]
        assert (items[-1]["kind"], items[-1]["text"]) == ("note", ALERT)
        assert label == LABEL.format(job=items[-1]["by"].split()[2])  # who said it, shown
        assert items[-1]["by"].endswith("(a monitor)")
        async with ws_client(serve) as ws:  # a client connecting later, and the next turn
            await ws_hello(ws, "personal")
            await _send(ws, "fix it")
        store.close()
    first, second = model.personal
    n = len(first.messages)
    assert second.messages[:n] == first.messages  # appended: the cached prefix holds
    reply, alert, asked = second.messages[n:]
    assert (reply.role, reply.text) == ("assistant", "Answer 1.")
    assert (alert.role, alert.text) == ("user", label + ALERT)
    assert asked.text.startswith("fix it")


async def test_said_while_a_turn_runs_there_it_is_shown_at_once_and_kept_after_that_turn():
    clock, model = FakeClock(START), Model()
    model.release.clear()
    services = [lambda loop: run_proactive(loop, clock=clock)]
    async with running_serve(ScriptedProvider(model), services=services) as serve:
        store = Store(Settings.load().paths.db)
        async with ws_client(serve) as ws:
            await ws_hello(ws, "personal")
            await ws.send(json.dumps({"type": "send", "text": "hello"}))
            await until(lambda: model.personal, timeout=WAIT)  # the turn runs in `personal`
            await _fire_monitor(clock, store)
            said = await ws_until(ws, "message")  # live, at once, while the turn runs
            await until(lambda: model.told, timeout=WAIT)
            assert not any(r.meta.get(RELAY_META) for r in _rows(store, "personal"))
            model.release.set()
            await ws_until(ws, "idle")
            await until(
                lambda: any(r.meta.get(RELAY_META) for r in _rows(store, "personal")), timeout=WAIT
            )
        store.close()
    assert said[-1]["text"] == ALERT and said[-1]["by"].startswith("scheduled job ")
    assert model.told == [
        "Delivered: shown to the user now, and kept in conversation 'personal' once the turn"
        " running there ends."
    ]
    store = Store(Settings.load().paths.db)
    try:
        rows = [(r.author, r.message.text) for r in _rows(store, "personal")]
    finally:
        store.close()
    assert rows[-2:] == [("model", "Answer 1."), ("heron", ALERT)]  # after the turn, not in it
