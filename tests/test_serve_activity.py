"""`turn_start` names the stored message that opened the turn, and every browser tab hears
where turns run and where a question or a command's approval waits for the person's answer
(a hub `status` outside any conversation), whoever started them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from proactive_helpers import Routed, call, text, tools
from serve_helpers import LineClient, running_serve, ws_client, ws_hello, ws_next, ws_until

from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, ToolResult, Usage
from heron.providers.scripted import ScriptedProvider
from heron.serve.lock import SOCKET_NAME
from heron.store import Store


def _echo(request) -> Reply:
    said = request.messages[-1].text.partition("[Runtime")[0].strip()
    return Reply([Text(f"echo: {said}")], "done")


def _user_ids(key: str) -> list[int]:
    store = Store(Settings.load().paths.db)
    try:
        conversation = store.conversation(key)
        assert conversation is not None
        return [r.id for r in store.branch(conversation.id) if r.role == "user"]
    finally:
        store.close()


async def test_turn_start_carries_the_id_of_the_stored_message_it_answers():
    async with running_serve(ScriptedProvider(_echo)) as serve, ws_client(serve) as ws:
        await ws_hello(ws)
        await ws.send(json.dumps({"type": "send", "text": "hello there"}))
        first = await ws_until(ws, "idle")
        [asked] = _user_ids("personal")
        await ws.send(json.dumps({"type": "command", "text": "/retry"}))
        retried = await ws_until(ws, "idle")
        [again] = _user_ids("personal")  # the message anew, on a new branch
        await ws.send(json.dumps({"type": "command", "text": "/status"}))
        status = await ws_until(ws, "idle")
    assert first[0]["type"] == "turn_start" and first[0]["message_id"] == asked
    assert first[1] == {**first[1], "type": "status", "state": "working"}
    assert retried[0]["message_id"] == again != asked
    assert status[0]["type"] == "turn_start" and status[0]["message_id"] is None
    seqs = [e["seq"] for e in first + retried + status]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # held, never reordered


async def _hub_status(ws) -> dict[str, Any]:
    while True:
        event = await ws_next(ws, hub=True)
        if event["type"] == "status" and event["state"] == "running":
            assert "seq" not in event and "conversation" not in event
            return event


async def _running(ws) -> list[str]:
    return (await _hub_status(ws))["running"]


async def _waiting(ws, until: list[str]) -> list[dict[str, Any]]:
    """The hub's statuses up to the first whose `waiting` is `until`."""
    seen = [await _hub_status(ws)]
    while seen[-1]["waiting"] != until:
        seen.append(await _hub_status(ws))
    return seen


async def test_every_tab_hears_where_a_turn_runs_whoever_started_it(heron_home):
    gate = asyncio.Event()

    async def slow(request) -> Reply:
        await gate.wait()
        return _echo(request)

    provider = ScriptedProvider(slow)
    async with running_serve(provider) as serve, ws_client(serve) as here, ws_client(serve) as far:
        await ws_hello(here, "personal")
        elsewhere = await ws_hello(far, "elsewhere")
        assert elsewhere["running"] == []
        terminal = await LineClient.open(heron_home / SOCKET_NAME)
        await terminal.send({"type": "hello", "conversation": "personal", "last_seq": None})
        await terminal.next()  # welcome
        await terminal.send({"type": "send", "text": "from the terminal"})
        assert await _running(far) == ["personal"]  # the tab on another conversation
        assert await _running(here) == ["personal"]
        async with ws_client(serve) as late:
            assert (await ws_hello(late, "third"))["running"] == ["personal"]
        gate.set()
        assert await _running(far) == []
        assert await _running(here) == []
        told = []
        while (event := await terminal.next())["type"] != "turn_end":
            told.append(event)
        await terminal.close()
    assert not any(e["type"] == "status" and e["state"] == "running" for e in told)


async def test_every_tab_hears_where_a_question_waits_for_an_answer_until_it_is_answered():
    def trip(request, n):
        return call("ask_user", question="Which city?") if n == 1 else text("Booked.")

    model = Routed({"trip": trip})
    async with (
        running_serve(ScriptedProvider(model), tools()) as serve,
        ws_client(serve) as here,
        ws_client(serve) as far,
    ):
        await ws_hello(here, "trip")
        assert (await ws_hello(far, "elsewhere"))["waiting"] == []
        await here.send(json.dumps({"type": "send", "text": "book me a trip"}))
        asked = await _waiting(far, ["trip"])  # the tab on another conversation
        assert asked[-1]["running"] == ["trip"]
        async with ws_client(serve) as late:
            assert (await ws_hello(late, "third"))["waiting"] == ["trip"]
        await here.send(json.dumps({"type": "send", "text": "Berlin"}))
        answered = await _waiting(far, [])
        await ws_until(here, "idle")
    assert answered[-1]["running"] == ["trip"]  # answered: the turn runs on, waiting no more
    assert await _running(far) == []


@pytest.mark.usefixtures("unconfined")
async def test_a_command_waiting_for_approval_is_marked_until_it_is_decided():
    def run_it(request) -> Reply:
        if any(isinstance(p, ToolResult) for m in request.messages for p in m.parts):
            return Reply([Text("ran")], "done", Usage(10, 2))
        return Reply([ToolCall("c1", "bash", {"command": "echo hi"})], "tool_use", Usage(10, 2))

    async with (
        running_serve(ScriptedProvider(run_it)) as serve,
        ws_client(serve) as here,
        ws_client(serve) as far,
    ):
        await ws_hello(here, "cmd")
        await ws_hello(far, "elsewhere")
        await here.send(json.dumps({"type": "send", "text": "run it"}))
        await _waiting(far, ["cmd"])
        approval = (await ws_until(here, "approval"))[-1]
        await here.send(json.dumps({"type": "approve", "id": approval["id"], "allow": True}))
        await _waiting(far, [])
        await ws_until(here, "idle")


@pytest.fixture
def unconfined(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine where bubblewrap cannot run: approval is "ask"."""
    monkeypatch.setenv("HERON_BWRAP", "off")
