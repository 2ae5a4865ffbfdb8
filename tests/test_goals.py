"""Sustained goals: nudged for their budget then parked, done with evidence, the person's
message first, the objective in the runtime block once, no model deadline."""

from __future__ import annotations

import asyncio

import pytest
from proactive_helpers import Routed, call, running_loop, text

from heron.agent.turn import NO_DEADLINE, bounds
from heron.bus import InboundMessage, TurnOptions
from heron.proactive import goals as g
from heron.store import goals
from heron.tools.message import with_message_tool
from heron.tools.registry import ToolRegistry

# Every test once per backend: the engine on SQLite, and on PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")


def tools() -> ToolRegistry:
    return with_message_tool(ToolRegistry([]))


def _runtime(request) -> str:
    return request.messages[-1].parts[-1].text  # the runtime block after the last message


async def test_a_goal_continues_for_its_budget_and_then_parks():
    deadlines: list[bool] = []
    holder = {}

    def origin(request, n):
        deadlines.append(holder["loop"].active_control("test:me").options.no_deadline)
        return text(f"working {n}")

    model = Routed({"test:": origin})
    async with running_loop(model, tools()) as (engine, loop, said):
        holder["loop"] = loop
        g.attach(loop)
        goals.set_goal(engine.store, "test:me", "Write the report", max_turns=2)
        await loop.dispatch(InboundMessage("test", "me", "go"))
        await loop.wait_idle()
        goal = goals.history(engine.store, "test:me")[0]
    requests = model.seen["test:me"]
    assert len(requests) == 3  # the person's turn, then two nudges
    assert "Goal (sustained" in _runtime(requests[0]) and "Write the report" in _runtime(
        requests[0]
    )
    assert "Goal: unchanged" in _runtime(requests[1]) and "Write the report" not in _runtime(
        requests[1]
    )
    assert requests[1].messages[-1].text.startswith("[Heron: your goal continues]")
    assert deadlines == [True, True, True]
    assert goal.status == "parked" and goal.turns_used == 2
    notices = [o for o in said if o.kind == "notice"]
    assert len(notices) == 1 and notices[0].text.startswith("Goal parked")
    assert [o.text for o in said if o.kind == "answer"] == ["working 1", "working 2", "working 3"]


async def test_the_agent_marks_it_done_with_evidence():
    def origin(request, n):
        if n == 1:
            return call("goal", action="done")  # no evidence: refused
        if n == 2:
            return call("goal", n=2, action="done", evidence="all 12 tests pass")
        return text("Finished.")

    model = Routed({"test:": origin})
    async with running_loop(model, tools()) as (engine, loop, _said):
        g.attach(loop)
        goals.set_goal(engine.store, "test:me", "Make the tests pass")
        await loop.dispatch(InboundMessage("test", "me", "go"))
        await loop.wait_idle()
        goal = goals.history(engine.store, "test:me")[0]
    refused = model.seen["test:me"][1].messages[-1].parts[0]
    assert refused.is_error and "evidence" in refused.content
    assert goal.status == "done" and goal.evidence == "all 12 tests pass"
    assert len(model.seen["test:me"]) == 3  # no nudge after it is done


async def test_the_persons_message_goes_before_a_nudge():
    release = asyncio.Event()
    order: list[str] = []

    async def origin(request, n):
        order.append(request.messages[-1].parts[0].text[:12])
        if n == 1:
            await release.wait()
        if n >= 3:
            goals.end_goal(store_of["s"], "test:me", "done")
        return text("ok")

    store_of = {}
    model = Routed({"test:": origin})
    async with running_loop(model, tools()) as (engine, loop, _):
        store_of["s"] = engine.store
        g.attach(loop)
        goals.set_goal(engine.store, "test:me", "Tidy up")
        await loop.dispatch(InboundMessage("test", "me", "first"))
        while len(order) < 1:
            await asyncio.sleep(0)
        loop.active_control("test:me").accepting_mail = False  # past its last drain
        await loop.dispatch(InboundMessage("test", "me", "second"))
        release.set()
        await loop.wait_idle()
    assert order == ["first", "second", "[Heron: your"]


async def test_goal_command_shows_sets_budgets_and_ends():
    model = Routed({"test:": lambda r, n: text("on it")})
    async with running_loop(model, tools()) as (engine, loop, _said):
        g.attach(loop)
        store = engine.store
        none = g.goal_command(store, "test:me", "")
        made = g.goal_command(store, "test:me", "Ship the release")
        shown = g.goal_command(store, "test:me", "")
        bad = g.goal_command(store, "test:me", "budget lots")
        budget = g.goal_command(store, "test:me", "budget 5 1000")
        ended = g.goal_command(store, "test:me", "stop")
        again = g.goal_command(store, "test:me", "done")
    assert none.startswith("No goal")
    assert made.startswith("Goal set") and "Ship the release" in shown and "active" in shown
    assert "whole numbers" in bad and budget.startswith("Goal budget: 5 turns, 1,000 tokens")
    assert ended.startswith("Goal ended (stop)") and again == "No goal to end."


async def test_a_goal_command_turn_starts_the_work():
    model = Routed(
        {
            "test:": lambda r, n: (
                call("goal", action="done", evidence="e") if n == 1 else text("done")
            )
        }
    )
    async with running_loop(model, tools()) as (engine, loop, said):
        g.attach(loop)
        await loop.dispatch(InboundMessage("test", "me", "/goal Count the files"))
        await loop.wait_idle()
        goal = goals.history(engine.store, "test:me")[0]
    assert said[0].kind == "command" and said[0].text.startswith("Goal set")
    assert len(model.seen["test:me"]) == 2  # the nudge worked on it and marked it done
    assert goal.status == "done"


async def test_a_conversation_opened_by_goal_is_titled_with_its_objective_not_the_nudge(capsys):
    """QA: every goal conversation was titled "[Heron: your goal continues] Keep working...",
    and `conversations show` never said where the goal was set (/goal stores no message)."""
    from heron.channels.info import show_conversation

    model = Routed({"test:": lambda r, n: call("goal", action="done", evidence="e")})
    async with running_loop(model, tools()) as (engine, loop, _said):
        g.attach(loop)
        await loop.dispatch(InboundMessage("test", "owls", "/goal Count the owls"))
        await loop.wait_idle()
        conversation = engine.store.conversation("test:owls")
        capsys.readouterr()
        show_conversation(engine.settings, "test:owls")
    assert conversation is not None and conversation.title == "Count the owls"
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("── goal set (done): Count the owls")
    assert at < next(i for i, line in enumerate(lines) if g.NUDGE[:20] in line)


async def test_no_model_deadline_for_a_goal_turn():
    async with running_loop(Routed({}), ToolRegistry([])) as (engine, _, _said):
        plain = bounds(engine, TurnOptions())[2].deadline
        goal = bounds(engine, TurnOptions(no_deadline=True))[2].deadline
    assert plain == engine.retry.deadline and goal == NO_DEADLINE > 10 * plain


def test_goal_conversations_titled_with_the_nudge_before_are_retitled_by_the_migration(home_db):
    """Conversations a goal opened before titles skipped the nudge all read "[Heron: your goal
    continues] Keep working toward…" in a list; the migration gives them their objective."""
    from heron.store import Store
    from heron.store.migrations import m022_goal_titles

    store = Store(home_db)
    try:
        old = store.open_conversation("test:owls")
        store.set_title(old.id, g.NUDGE[:60] + "…")
        goals.set_goal(store, "test:owls", "Count the owls in the barn\nand the wood")
        goals.set_goal(store, "test:owls", "A later goal")
        lost = store.open_conversation("test:lost")  # its goal row is gone: left as it is
        store.set_title(lost.id, g.NUDGE[:60] + "…")
        with store.transaction() as c:
            m022_goal_titles.apply(c)
        titles = {k: store.conversation(k).title for k in ("test:owls", "test:lost")}
    finally:
        store.close()
    assert titles["test:owls"] == "Count the owls in the barn"
    assert titles["test:lost"] == g.NUDGE[:60] + "…"


async def test_setting_a_goal_over_an_open_one_says_the_old_one_was_stopped():
    model = Routed({"test:": lambda r, n: text("on it")})
    async with running_loop(model, tools()) as (engine, _loop, _said):
        store = engine.store
        first = g.goal_command(store, "test:me", "Ship the release")
        second = g.goal_command(store, "test:me", "Write the changelog")
        history = goals.history(store, "test:me")
    assert "stopped" not in first
    assert second.startswith("Goal set") and "Write the changelog" in second
    assert "The previous goal was stopped and replaced: Ship the release" in second
    assert sorted(x.status for x in history) == ["active", "stopped"]


async def test_a_parked_goal_is_said_in_its_conversation_as_heron_s_row():
    """Parking is stored, not only a live notice: the person who walked away reads it later,
    and the next turn's model reads it as Heron's words, not the person's."""
    model = Routed({"test:": lambda r, n: text(f"working {n}")})
    async with running_loop(model, tools()) as (engine, loop, _said):
        g.attach(loop)
        goals.set_goal(engine.store, "test:me", "Write the report", max_turns=1)
        await loop.dispatch(InboundMessage("test", "me", "go"))
        await loop.wait_idle()
        await loop.dispatch(InboundMessage("test", "me", "so?"))
        await loop.wait_idle()
        rows = engine.store.branch(engine.store.conversation("test:me").id)
    parked = [r for r in rows if r.message.text.startswith("Goal parked")]
    assert len(parked) == 1 and parked[0].author == "heron" and parked[0].message.role == "user"
    assert "Write the report" in parked[0].message.text
    assert rows.index(parked[0]) == len(rows) - 3  # after the last nudge, before "so?"
    seen = "\n".join(m.text for m in model.seen["test:me"][-1].messages)
    assert f"[Sent to the user by {g.GOAL_WHO}, not written by the user] Goal parked" in seen


async def test_a_failed_nudge_is_said_in_the_conversation():
    from heron.errors import ProviderError

    def origin(request, n):
        if n == 2:
            raise ProviderError("the model is down")
        return text(f"working {n}")

    model = Routed({"test:": origin})
    async with running_loop(model, tools()) as (engine, loop, _said):
        g.attach(loop)
        goals.set_goal(engine.store, "test:me", "Write the report")
        await loop.dispatch(InboundMessage("test", "me", "go"))
        await loop.wait_idle()
        rows = engine.store.branch(engine.store.conversation("test:me").id)
        goal = goals.open_goal(engine.store, "test:me")
    said = [r for r in rows if r.author == "heron" and r.message.text.startswith("Goal waiting")]
    assert len(model.seen["test:me"]) == 2  # no loop on failures
    assert goal.status == "active"
    assert len(said) == 1 and "the model is down" in said[0].message.text


def test_a_parked_goal_is_described_without_nested_brackets():
    parked = goals.Goal(1, "k", "Ship it", "parked", 20, 1000, 20, 500, None, None)
    said = g.describe(parked)
    assert said == "Goal (parked, its budget ran out; 20 of 20 turns, 500 of 1,000 tokens): Ship it"


async def test_a_background_turn_cannot_set_a_goal():
    """A reminder's turn set a goal, and 20 nudges ran with nobody there: a goal is the
    person's to set, as a question is theirs to answer."""

    def origin(request, n):
        if n == 1:
            return call("goal", action="set", objective="keep working")
        return text("Told them instead.")

    model = Routed({"test:": origin})
    async with running_loop(model, tools()) as (engine, loop, _said):
        g.attach(loop)
        await loop.dispatch(
            InboundMessage("test", "me", "[Scheduled reminder]", provenance="reminder")
        )
        await loop.wait_idle()
        made = goals.history(engine.store, "test:me")
    refused = model.seen["test:me"][1].messages[-1].parts[0]
    assert made == [] and len(model.seen["test:me"]) == 2  # no nudge followed
    assert refused.is_error and "background work" in refused.content
