"""A seq counts in the serve process that numbered it: every welcome names the hub's
`instance`, and a client that comes back to another instance (the serve was restarted and
numbers from 0 again) is told `gap`, whatever its old `last_seq`, so it rereads the store and
takes the new numbering instead of dropping every event up to its old number. A turn a killed
serve left running is closed as interrupted when the next one starts, or when a client reads
its transcript."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from serve_helpers import running_serve, ws_client, ws_hello, ws_next, ws_until

from heron.bus import TurnEvent
from heron.config import Settings
from heron.messages import Message, Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.serve.hub import Client, Hub
from heron.store import Store
from heron.store import engine_state as es


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


def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid now names no process: a serve killed (kill -9) mid-turn
    return dead.pid


def _left_running(key: str, pid: int) -> int:
    """A turn as process `pid` of this host leaves it when killed mid-turn: the message
    stored, the turn row `running`, the conversation's lease still its own. Its turn id."""
    store = Store(Settings.load().paths.db)
    conversation = store.open_conversation(key)
    said = Message("user", [Text("slow KILL")])
    turn_id, _ = store.begin_turn(conversation.id, f"run_{key}", said)
    now = time.time()
    with store.transaction() as c:
        c.execute(
            "INSERT INTO turn_leases (conversation_id, owner, host, pid, run_id, acquired,"
            " expires) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (conversation.id, f"{es.HOST}:{pid}:1", es.HOST, pid, f"run_{key}", now, now + 30),
        )
    store.close()
    return turn_id


def _status(turn_id: int) -> str:
    store = Store(Settings.load().paths.db)
    try:
        return str(store.query("SELECT status FROM turns WHERE id = ?", (turn_id,))[0][0])
    finally:
        store.close()


async def _last_item(serve, key: str) -> dict:
    async with serve.http() as http:
        response = await http.get(f"/api/conversations/{key}/transcript")
    return response.json()["items"][-1]


async def test_a_turn_a_killed_serve_left_running_is_closed_when_the_next_serve_starts():
    """QA20m #2: the page that reconnects after a `kill -9` shows the stopped note (and so
    /retry) at once, not the person's message with nothing under it until the next message."""
    left = _left_running("personal", _dead_pid())
    async with running_serve(ScriptedProvider(_echo)) as serve:
        assert _status(left) == "interrupted"
        item = await _last_item(serve, "personal")
    assert item == {**item, "kind": "note", "text": "This turn was stopped before it finished."}


async def test_a_turn_left_by_a_process_killed_while_the_serve_runs_is_closed_on_reading():
    """A `heron run --model` beside the serve killed mid-turn: the transcript a client reads
    shows it stopped. A turn whose process lives (this one, as another owner) is left be."""
    async with running_serve(ScriptedProvider(_echo)) as serve:
        left, alive = _left_running("killed", _dead_pid()), _left_running("alive", os.getpid())
        assert (await _last_item(serve, "killed"))["kind"] == "note"  # the stopped note
        assert (await _last_item(serve, "alive"))["kind"] == "user"
    assert (_status(left), _status(alive)) == ("interrupted", "running")
