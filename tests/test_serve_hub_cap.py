"""The hub keeps at most `cap` idle conversations loaded: the least recently used is unloaded
(its seq kept), reloaded on next use, and a client that comes back to it is told `gap` and
rereads the store, where everything still is."""

from __future__ import annotations

import json

from serve_helpers import running_serve, ws_client, ws_hello, ws_until

from heron.bus import TurnEnd, TurnEvent
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.serve import hub as hub_module
from heron.serve.hub import Client, Hub


def _delta(key: str, text: str = "x") -> TurnEvent:
    return TurnEvent("web", "1", key, "delta", text)


async def test_past_the_cap_the_least_recently_used_idle_journal_is_unloaded_with_its_seq():
    hub = Hub(cap=2)
    for key in ("a", "b", "c"):
        await hub.deliver(_delta(key))
    await hub.deliver(_delta("a"))  # a is used again: b is now the least recent
    await hub.deliver(_delta("d"))
    assert list(hub.journals) == ["a", "d"] and hub.unloaded == {"b": 1, "c": 1}
    await hub.deliver(_delta("b"))  # reloaded: its numbering goes on where it stopped
    assert hub.journals["b"].seq == 2 and "b" not in hub.unloaded


async def test_a_client_back_on_an_unloaded_conversation_is_told_gap_unless_it_saw_everything():
    hub = Hub(cap=1)
    for key in ("a", "a", "b", "c"):
        await hub.deliver(_delta(key))
    assert "a" not in hub.journals and hub.unloaded["a"] == 2
    behind, current = Client("web", "behind"), Client("web", "current")
    hub.attach(behind, "a", 1)
    welcome = behind.queue.get_nowait()
    assert welcome["gap"] is True and welcome["seq"] == 2 and behind.queue.empty()
    hub.attach(current, "a", 2)
    welcome = current.queue.get_nowait()
    assert welcome["seq"] == 2 and "gap" not in welcome and current.queue.empty()


async def test_journals_with_a_client_or_a_running_turn_are_never_unloaded():
    hub = Hub(cap=0)
    watcher = Client("web", "w")
    hub.attach(watcher, "watched", None)
    await hub.deliver(TurnEvent("web", "1", "running", "turn_start", "go"))
    for i in range(5):
        await hub.deliver(_delta(f"other-{i}"))
    assert set(hub.journals) == {"watched", "running"}
    await hub.deliver(TurnEvent("web", "1", "running", "turn_end", end=TurnEnd(True, "delivered")))
    hub.detach(watcher)
    assert hub.journals == {} and hub.unloaded["running"] == 4  # start, working, end, idle


def _echo(request) -> Reply:
    said = request.messages[-1].text.partition("[Runtime")[0].strip()
    return Reply([Text(f"echo: {said}")], "done")


async def test_through_a_serve_an_unloaded_conversation_loses_nothing(monkeypatch):
    monkeypatch.setattr(hub_module, "IDLE_CAP", 1)
    async with running_serve(ScriptedProvider(_echo)) as serve, ws_client(serve) as ws:
        seen = {}
        for key in ("first", "second", "third"):
            await ws_hello(ws, key)
            await ws.send(json.dumps({"type": "send", "text": f"hello {key}"}))
            seen[key] = (await ws_until(ws, "idle"))[-1]["seq"]
        # first and second are idle now; with a cap of 1, first was let go.
        back = await ws_hello(ws, "first", seen["first"])
        assert back["seq"] == seen["first"] and "gap" not in back
        await ws.send(json.dumps({"type": "send", "text": "hello again"}))
        again = await ws_until(ws, "idle")
        assert again[0]["seq"] == seen["first"] + 1  # numbering went on, nothing repeated
        reread = await ws_hello(ws, "second", 0)  # let go when the client left third
        assert reread["gap"] is True
        async with serve.http() as http:
            first = (await http.get("/api/conversations/first/transcript")).json()
    users = [it["text"] for it in first["items"] if it["kind"] == "user"]
    assert users == ["hello first", "hello again"]
