"""A seq counts in the serve process that numbered it: every welcome names the hub's
`instance`, and a client that comes back to another instance (the serve was restarted and
numbers from 0 again) is told `gap`, whatever its old `last_seq`, so it rereads the store and
takes the new numbering instead of dropping every event up to its old number."""

from __future__ import annotations

import json

from serve_helpers import running_serve, ws_client, ws_hello, ws_next, ws_until

from heron.bus import TurnEvent
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.serve.hub import Client, Hub


def _delta(key: str) -> TurnEvent:
    return TurnEvent("web", "1", key, "delta", "x")


async def _hub_with(events: int) -> Hub:
    hub = Hub()
    for _ in range(events):
        await hub.deliver(_delta("c"))
    return hub


async def test_a_client_of_the_same_instance_gets_what_it_missed():
    hub = await _hub_with(5)
    client = Client("web", "same")
    hub.attach(client, "c", 3, hub.instance)
    welcome = client.queue.get_nowait()
    assert welcome["instance"] == hub.instance and "gap" not in welcome
    assert [client.queue.get_nowait()["seq"] for _ in range(2)] == [4, 5]


async def test_a_last_seq_of_another_instance_is_a_gap_whatever_its_number():
    hub = await _hub_with(5)
    for last in (2, 5, 900):  # below, at and above this hub's count
        client = Client("web", f"old-{last}")
        hub.attach(client, "c", last, "a-serve-that-stopped")
        welcome = client.queue.get_nowait()
        assert welcome["gap"] is True and welcome["seq"] == 5, last
        assert client.queue.empty()  # nothing of this serve's is passed off as what it missed


async def test_a_last_seq_this_serve_never_reached_is_a_gap_without_an_instance():
    """A client that names no instance (an older page) but counts past this hub's newest seq
    can only have been numbered by another serve."""
    hub = await _hub_with(2)
    client = Client("web", "ahead")
    hub.attach(client, "c", 40)
    assert client.queue.get_nowait()["gap"] is True


def _echo(request) -> Reply:
    said = request.messages[-1].text.partition("[Runtime")[0].strip()
    return Reply([Text(f"echo: {said}")], "done")


async def _turn(ws, text: str) -> list[dict]:
    await ws.send(json.dumps({"type": "send", "text": text}))
    return await ws_until(ws, "idle")


async def test_resume_across_a_restart_is_told_gap_and_follows_the_new_numbering():
    model = ScriptedProvider(_echo)
    async with running_serve(model) as first, ws_client(first) as ws:
        welcome = await ws_hello(ws, "personal", 0)
        old = welcome["instance"]
        for n in range(4):  # the first serve's count goes well past what the next one sends
            events = await _turn(ws, f"before {n}")
        last_seq = events[-1]["seq"]
    assert last_seq > 10
    async with running_serve(model) as second, ws_client(second) as ws:
        hello = {"type": "hello", "conversation": "personal", "last_seq": last_seq}
        await ws.send(json.dumps({**hello, "instance": old}))
        welcome = await ws_next(ws)
        assert welcome["instance"] != old
        assert welcome["gap"] is True and welcome["seq"] < last_seq
        events = await _turn(ws, "after the restart")
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(welcome["seq"] + 1, welcome["seq"] + 1 + len(events)))
        assert any(
            e.get("text") == "echo: after the restart" for e in events if e["type"] == "delta"
        )
