"""Subagents, ask_user and goals in `heron serve`: a result announced in its conversation and
seen by its clients, a question answered from another client, a goal nudged on, and a
shutdown with a subagent running (interrupted, announced by the next serve), all through the
serve's websocket and control socket with a scripted model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from proactive_helpers import Routed, call, last_user_text, spawns_then_answers, text, tools
from serve_helpers import LineClient, running_serve, ws_client, ws_hello, ws_next, ws_until

from heron.config import Settings
from heron.context.repair import is_well_formed
from heron.messages import ToolResult
from heron.proactive.goals import NUDGE
from heron.providers.scripted import ScriptedProvider
from heron.serve.lock import SOCKET_NAME
from heron.store import Store, goals, runs


def _store() -> Store:
    return Store(Settings.load().paths.db)


def _result_rows(store: Store, key: str) -> list[Any]:
    conv = store.conversation(key)
    assert conv is not None
    return [r for r in store.branch(conv.id) if r.meta.get(runs.RUN_META)]


def _tool_results(request: Any) -> list[str]:
    return [p.content for m in request.messages for p in m.parts if isinstance(p, ToolResult)]


async def _send(ws: Any, text: str, kind: str = "send") -> None:
    await ws.send(json.dumps({"type": kind, "text": text}))


def _ends(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "turn_end"]


async def test_a_spawned_subagents_result_is_announced_to_the_clients_and_recorded_once():
    released = asyncio.Event()

    async def sub(request, n):
        await released.wait()  # the origin's turn has ended: the result opens a turn
        return text("42")

    model = Routed({"personal": spawns_then_answers, "subagent:": sub})
    async with running_serve(ScriptedProvider(model), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws)
        await _send(ws, "work it out")
        first = await ws_until(ws, "idle")
        released.set()
        second = await ws_until(ws, "idle")
    assert [e["reply"] for e in _ends(first)] == ["I asked a subagent."]
    start = next(e for e in second if e["type"] == "turn_start")
    assert start["text"].startswith("[Subagent result, not written by the user]")
    assert [e["reply"] for e in _ends(second)] == ["The subagent says 42."]
    store = _store()
    try:
        (run,) = runs.listing(store)
        rows = _result_rows(store, "personal")
        assert run.status == "done" and run.result == "42" and run.announced is not None
        assert len(rows) == 1 and rows[0].author == "heron" and "42" in rows[0].message.text
    finally:
        store.close()


async def test_ask_user_waits_for_the_next_message_from_any_client_and_resumes():
    def origin(request, n):
        if n == 1:
            return call("ask_user", question="Which city?")
        assert any("The user answered: Berlin" in r for r in _tool_results(request))
        return text("Booked Berlin.")

    model = Routed({"trip": origin})
    async with running_serve(ScriptedProvider(model), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "trip")
        terminal = await LineClient.open(Settings.load().paths.home / SOCKET_NAME)
        try:
            await terminal.send({"type": "hello", "conversation": "trip", "channel": "cli"})
            assert (await terminal.next())["type"] == "welcome"
            await _send(ws, "book me a trip")
            asked = [e for e in await ws_until(ws, "message")]
            seen = [e for e in await terminal.until("message")]
            for events in (asked, seen):
                assert events[-1]["kind"] == "question" and "Which city?" in events[-1]["text"]
            await terminal.send({"type": "send", "text": "Berlin"})
            rest = await ws_until(ws, "idle")
        finally:
            await terminal.close()
    assert [e["type"] for e in rest].count("turn_start") == 0  # the answer opened no turn
    assert {"type": "status", "state": "mail"}.items() <= rest[0].items()
    assert [e["reply"] for e in _ends(rest)] == ["Booked Berlin."]
    assert len(model.seen["trip"]) == 2  # the question's call, then the answer: one turn
    store = _store()
    try:
        (run,) = runs.listing(store)
        assert (run.kind, run.status, run.result) == ("ask", "answered", "Berlin")
        assert len(store.turns(store.conversation("trip").id)) == 1
    finally:
        store.close()


async def test_a_terminal_attaching_while_a_question_waits_is_asked_and_can_answer():
    """A client that attaches without replaying the journal (a terminal) after the question
    was asked is sent it, and its answer resumes the run; once answered, a later one is not
    asked again."""

    def origin(request, n):
        if n == 1:
            return call("ask_user", question="Which city?")
        return text("Booked " + _tool_results(request)[-1].split(": ")[-1])

    model = Routed({"trip": origin})
    home = Settings.load().paths.home
    # What `heron chat` through a serve says: nothing of the past replayed (last_seq None).
    hello_now = {"type": "hello", "conversation": "trip", "channel": "cli", "last_seq": None}
    async with running_serve(ScriptedProvider(model), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "trip")
        await _send(ws, "book me a trip")
        await ws_until(ws, "message")  # the question, asked before the terminal came
        terminal = await LineClient.open(home / SOCKET_NAME)
        try:
            await terminal.send(hello_now)
            assert (await terminal.next())["type"] == "welcome"
            asked = (await terminal.until("message"))[-1]
            assert (asked["type"], asked["kind"]) == ("message", "question"), asked
            assert "Which city?" in asked["text"]
            await terminal.send({"type": "send", "text": "Lisbon"})
            rest = await ws_until(ws, "idle")
        finally:
            await terminal.close()
        late = await LineClient.open(home / SOCKET_NAME)
        try:
            await late.send(hello_now)
            await late.until("welcome")
            await late.send(hello_now)
            between = await late.until("welcome")  # what the first hello was sent
            assert [e["type"] for e in between] == ["welcome"]  # no question any more
        finally:
            await late.close()
    assert [e["reply"] for e in _ends(rest)] == ["Booked Lisbon"]


async def test_slash_goal_through_the_serve_sets_a_goal_and_a_nudge_turn_follows():
    def origin(request, n):
        assert last_user_text(request).startswith(NUDGE[:20])
        if n == 1:
            runtime = request.messages[-1].parts[-1].text  # after the last message
            assert "Goal (sustained" in runtime and "Write three lines" in runtime
            return call("goal", action="done", evidence="three lines written")
        return text("The goal is met.")

    model = Routed({"plan": origin})
    async with running_serve(ScriptedProvider(model), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "plan")
        await _send(ws, "/goal Write three lines", "command")
        command = await ws_until(ws, "idle")
        nudge = await ws_until(ws, "idle")
    said = [e for e in command if e["type"] == "message"]
    assert said and said[0]["text"].startswith("Goal set")
    start = next(e for e in nudge if e["type"] == "turn_start")
    assert start["text"] == NUDGE
    assert [e["reply"] for e in _ends(nudge)] == ["The goal is met."]
    store = _store()
    try:
        assert goals.open_goal(store, "plan") is None
        assert goals.history(store, "plan")[0].status == "done"
    finally:
        store.close()


async def test_shutdown_interrupts_a_running_subagent_and_the_next_serve_announces_it():
    working = asyncio.Event()

    async def sub(request, n):
        if n == 1:
            return call("note", what="the config lives in /etc/app.toml")
        working.set()
        await asyncio.Event().wait()  # still at it when the serve stops
        raise AssertionError("not reached")

    def origin(request, n):
        return call("spawn", task="Find the config.") if n == 1 else text("Asked a subagent.")

    first = Routed({"personal": origin, "subagent:": sub})
    async with running_serve(ScriptedProvider(first), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws)
        await _send(ws, "find the config")
        await ws_until(ws, "idle")
        await asyncio.wait_for(working.wait(), 30)
    store = _store()
    try:
        (run,) = runs.listing(store)
        assert (run.status, run.partial, run.announced) == ("interrupted", True, None)
        assert "/etc/app.toml" in (run.result or "")
        assert _result_rows(store, "personal") == []
        for key in ("personal", run.conversation_key):  # nothing half-written: every call
            branch = store.branch(store.conversation(key).id)  # has its result
            assert branch and is_well_formed([r.wire for r in branch])
    finally:
        store.close()

    def answer(request, n):
        assert "was interrupted" in last_user_text(request)
        return text("It was cut off; the config is in /etc/app.toml.")

    second = Routed({"personal": answer})
    async with running_serve(ScriptedProvider(second), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws)
        events = await ws_until(ws, "idle")
        while not _ends(events):  # attached before the announce turn started: its events
            events += await ws_until(ws, "idle")
    assert [e["reply"] for e in _ends(events)] == [
        "It was cut off; the config is in /etc/app.toml."
    ]
    start = next(e for e in events if e["type"] == "turn_start")
    # Heron's own turn, not one of the clients the earlier serve had (their ids start afresh).
    assert (start["channel"], start["chat_id"], start["provenance"]) == (
        "heron",
        "heron",
        "announce",
    )
    store = _store()
    try:
        (run,) = runs.listing(store)
        assert run.announced is not None
        assert len(_result_rows(store, "personal")) == 1
    finally:
        store.close()


async def test_a_serve_with_default_services_offers_spawn_ask_user_and_goal():
    seen: list[set[str]] = []

    def origin(request, n):
        seen.append({t.name for t in request.tools})
        return text("ok")

    model = Routed({"personal": origin})
    async with running_serve(ScriptedProvider(model), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws)
        await _send(ws, "hi")
        await ws_until(ws, "idle")
        await _send(ws, "/goal", "command")
        answer = await ws_next(ws)
        while answer["type"] != "message":
            answer = await ws_next(ws)
    assert {"spawn", "ask_user", "goal", "note"} <= seen[0]
    assert answer["text"].startswith("No goal in this conversation")


async def test_stop_while_a_question_waits_ends_the_turn_and_the_question():
    model = Routed({"trip": lambda request, n: call("ask_user", question="Which city?")})
    async with running_serve(ScriptedProvider(model), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "trip")
        await _send(ws, "book me a trip")
        await ws_until(ws, "message")  # the question
        await ws.send(json.dumps({"type": "stop"}))
        stopped = await ws_until(ws, "idle")
        await _send(ws, "/status", "command")
        status = await ws_next(ws)
        while not (status["type"] == "message" and "conversation:" in status["text"]):
            status = await ws_next(ws)  # past the answer to /stop
    assert [e["interrupted"] for e in _ends(stopped)] == [True]
    assert "conversation: trip" in status["text"]
    assert "question" not in status["text"]  # no longer said to wait for an answer
    store = _store()
    try:
        (run,) = runs.listing(store)
        assert (run.kind, run.status) == ("ask", "interrupted")
    finally:
        store.close()


async def test_a_serve_continues_the_goals_a_closed_chat_left_and_parks_a_spent_one():
    store = Store(Settings.load().paths.ensure().db)
    try:
        goals.set_goal(store, "left", "Tidy the notes")  # set in a chat that has closed
        spent = goals.set_goal(store, "spent", "Sort the photos")
        goals.set_budget(store, spent.id, 1, 1_000)
        goals.count_turn(store, spent.id, 10)  # its one turn is used
    finally:
        store.close()

    def left(request, n):
        assert last_user_text(request).startswith(NUDGE[:20])
        if n == 1:
            return call("goal", action="done", evidence="notes tidied")
        return text("Tidied.")

    model = Routed({"left": left})
    async with running_serve(ScriptedProvider(model), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "left")
        events = await ws_until(ws, "turn_end")
        await ws_hello(ws, "spent")
        parked = await ws_until(ws, "message")
        await ws.send(json.dumps({"type": "work"}))
        work = await ws_next(ws)
    assert [e["provenance"] for e in events if e["type"] == "turn_start"] == ["goal"]
    assert _ends(events)[0]["reply"] == "Tidied."
    assert parked[-1]["kind"] == "notice" and parked[-1]["text"].startswith("Goal parked")
    assert work["goal"]["status"] == "parked"
    store = _store()
    try:
        assert goals.history(store, "left")[0].status == "done"
        assert [g.status for g in goals.history(store, "spent")] == ["parked"]
    finally:
        store.close()


@pytest.mark.slow  # the waiting question looks for a cancel from another process every 1 s
async def test_runs_cancel_from_another_process_drops_the_question_and_the_run_finishes():
    def origin(request, n):
        if n == 1:
            return call("ask_user", question="Which city?")
        assert any("dropped the question" in r for r in _tool_results(request))
        return text("Planned without a city.")

    model = Routed({"trip": origin})
    async with running_serve(ScriptedProvider(model), tools()) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "trip")
        await _send(ws, "book me a trip")
        await ws_until(ws, "message")  # the question
        store = _store()
        try:
            (run,) = runs.listing(store)
            changed, said = runs.cancel_by_person(store, run)  # what `heron runs cancel` does
        finally:
            store.close()
        rest = await ws_until(ws, "idle")
    assert changed and said == f"Cancelled ask {run.id}."
    assert [e["reply"] for e in _ends(rest)] == ["Planned without a city."]
