"""ask_user: the run parks with a question, the next message answers it and the run resumes
from the call; past its deadline, or cancelled, it ends with what it has."""

from __future__ import annotations

import asyncio

from proactive_helpers import FakeClock, Routed, call, running_loop, text

from heron.bus import InboundMessage
from heron.proactive import ask
from heron.store import runs
from heron.tools.message import with_message_tool
from heron.tools.registry import ToolRegistry


def _model(seen: list[str]) -> Routed:
    def origin(request, n):
        if n == 1:
            return call("ask_user", question="Which city?", minutes=30)
        result = request.messages[-1].parts[0].content  # the tool's answer, where it asked
        seen.append(result)
        return text(f"Done: {result}")

    return Routed({"test:": origin})


async def _wait_for_question(loop, key: str):
    while (control := loop.active_control(key)) is None or control.question is None:
        await asyncio.sleep(0)  # yields to the turn: no wall time involved
    return control.question


async def test_the_next_message_answers_and_the_run_resumes_where_it_asked():
    clock, seen = FakeClock(), []
    async with running_loop(_model(seen), with_message_tool(ToolRegistry([]))) as (e, loop, said):
        ask.attach(loop, sleep=clock.sleep, now=clock.now)
        await loop.dispatch(InboundMessage("test", "me", "plan my trip"))
        question = await _wait_for_question(loop, "test:me")
        (waiting,) = runs.listing(e.store)
        await loop.dispatch(InboundMessage("test", "me", "Lisbon"))
        await loop.wait_idle()
        (answered,) = runs.listing(e.store)
        turns = e.store.turns(e.store.conversation("test:me").id)
    assert waiting.status == "waiting" and waiting.deadline == clock.now() + 30 * 60
    assert question.text == "Which city?"
    assert seen == ["The user answered: Lisbon"]
    assert [o.kind for o in said] == ["question", "answer"]
    assert "Which city?" in said[0].text and said[1].text == "Done: The user answered: Lisbon"
    assert answered.status == "answered" and answered.result == "Lisbon"
    assert len(turns) == 1  # the answer did not open a turn of its own


async def test_past_its_deadline_the_run_ends_with_what_it_has():
    clock, seen = FakeClock(), []
    async with running_loop(_model(seen), with_message_tool(ToolRegistry([]))) as (e, loop, said):
        ask.attach(loop, sleep=clock.sleep, now=clock.now)
        await loop.dispatch(InboundMessage("test", "me", "plan my trip"))
        await _wait_for_question(loop, "test:me")
        await clock.sleepers(2)  # the deadline and the cancel watch
        clock.advance(29 * 60)
        await asyncio.sleep(0)
        assert loop.running("test:me")  # not yet
        clock.advance(60)
        await loop.wait_idle()
        (run,) = runs.listing(e.store)
    assert run.status == "expired"
    assert seen and seen[0].startswith("No answer within 30 minutes")
    assert said[-1].text.startswith("Done: No answer")


async def test_runs_cancel_drops_the_question():
    clock, seen = FakeClock(), []
    async with running_loop(_model(seen), with_message_tool(ToolRegistry([]))) as (e, loop, _):
        ask.attach(loop, sleep=clock.sleep, now=clock.now, poll_s=5)
        await loop.dispatch(InboundMessage("test", "me", "plan my trip"))
        question = await _wait_for_question(loop, "test:me")
        await clock.sleepers(2)
        runs.cancel(e.store, question.run_id)  # what `heron runs cancel` does, any process
        clock.advance(5)
        await loop.wait_idle()
        (run,) = runs.listing(e.store)
    assert run.status == "cancelled"
    assert seen and seen[0].startswith("The user dropped the question")


async def test_background_work_cannot_ask():
    seen: list[str] = []
    async with running_loop(_model(seen), with_message_tool(ToolRegistry([]))) as (e, loop, _):
        ask.attach(loop)
        await loop.dispatch(InboundMessage("test", "me", "tick", provenance="internal"))
        await loop.wait_idle()
        assert runs.listing(e.store) == []
    assert seen and "background work" in seen[0]


async def _asked_and_answered(e, loop, clock, answers: list[str]) -> None:
    """Two turns on test:me, each asking "Which city?" by a call of the same id (c1-ask_user:
    ids repeat across replies) and answered with the next of `answers`."""
    for answer in answers:
        await loop.dispatch(InboundMessage("test", "me", "plan my trip"))
        await _wait_for_question(loop, "test:me")
        await loop.dispatch(InboundMessage("test", "me", answer))
        await loop.wait_idle()


def _asks_each_turn(seen: list[str]) -> Routed:
    def origin(request, n):
        if n % 2 == 1:
            return call("ask_user", question="Which city?", minutes=30)
        seen.append(request.messages[-1].parts[0].content)
        return text("Booked.")

    return Routed({"test:": origin})


async def test_the_transcript_keeps_the_question_and_the_answer_where_the_call_was():
    """The browser's transcript (heron/web/transcript.py) shows a stored ask_user call as the
    question and the person's answer, read from the question's row, each turn its own."""
    from heron.web.transcript import build

    clock, seen = FakeClock(), []
    registry = with_message_tool(ToolRegistry([]))
    async with running_loop(_asks_each_turn(seen), registry) as (e, loop, _):
        ask.attach(loop, sleep=clock.sleep, now=clock.now)
        await _asked_and_answered(e, loop, clock, ["Lisbon", "Porto"])
        shown = build(e.store, "test:me")
    assert shown is not None
    replies = [i for i in shown.items if i.kind == "assistant"]
    kinds = [[(s.kind, s.text) for s in r.segments] for r in replies]
    assert kinds == [
        [("question", "Which city?"), ("answer", "Lisbon"), ("text", "Booked.")],
        [("question", "Which city?"), ("answer", "Porto"), ("text", "Booked.")],
    ]
    assert [i.text for i in shown.items if i.kind == "user"] == ["plan my trip"] * 2


async def test_conversations_show_prints_the_question_and_the_persons_answer(capsys):
    from heron.channels.info import show_conversation

    clock, seen = FakeClock(), []
    registry = with_message_tool(ToolRegistry([]))
    async with running_loop(_asks_each_turn(seen), registry) as (e, loop, _):
        ask.attach(loop, sleep=clock.sleep, now=clock.now)
        await _asked_and_answered(e, loop, clock, ["Lisbon", "Porto"])
        capsys.readouterr()
        show_conversation(e.settings, "test:me")
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("──")]
    asked = ["you: plan my trip", "assistant asks: Which city?"]
    lisbon = [*asked, "you: Lisbon", "assistant: Booked."]
    assert lines[1:] == [*lisbon, *asked, "you: Porto", "assistant: Booked."]


async def test_a_question_nobody_answered_says_so_in_the_transcript():
    from heron.web.transcript import build

    clock, seen = FakeClock(), []
    async with running_loop(_model(seen), with_message_tool(ToolRegistry([]))) as (e, loop, _):
        ask.attach(loop, sleep=clock.sleep, now=clock.now)
        await loop.dispatch(InboundMessage("test", "me", "plan my trip"))
        await _wait_for_question(loop, "test:me")
        await clock.sleepers(2)
        clock.advance(30 * 60)
        await loop.wait_idle()
        shown = build(e.store, "test:me")
    assert shown is not None
    (reply,) = [i for i in shown.items if i.kind == "assistant"]
    assert [(s.kind, s.text) for s in reply.segments][:2] == [
        ("question", "Which city?"),
        ("note", "No answer came before the question's deadline."),
    ]
