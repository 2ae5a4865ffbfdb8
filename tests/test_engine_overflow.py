"""A provider's context overflow: the turn compacts, builds its context again for the smaller
window (system prompt with the summary, view, governor) and the retry succeeds."""

from __future__ import annotations

from compaction_helpers import is_summary

from heron.agent.engine import Engine
from heron.config import Settings
from heron.errors import ContextOverflow
from heron.messages import Reply, Text, Usage, dumps
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.trace.read import load_run

QUESTION = "the big question"


async def test_an_overflow_compacts_and_the_smaller_retry_carries_the_summary():
    overflowed: list[ChatRequest] = []

    def answer(request: ChatRequest) -> Reply:
        if is_summary(request):
            return Reply([Text("## Facts\nthe user greeted twelve times")], "done", Usage(300, 20))
        if QUESTION in request.messages[-1].text and not overflowed:
            overflowed.append(request)
            raise ContextOverflow("prompt too long", status=400)
        return Reply([Text("answered")], "done", Usage(50, 5))

    provider = ScriptedProvider(answer)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        for i in range(12):
            await engine.turn("o", f"hello {i}: " + "some words to fill the context " * 20)
        result = await engine.turn("o", QUESTION)
        retry = provider.requests[-1]
        run = load_run(engine.store, result.run_id)
    assert result.ok and result.reply == "answered"
    assert result.states.count("RUN") == 2
    before, after = overflowed[0], retry
    assert len(after.messages) <= 9 < len(before.messages)  # the retry is smaller
    assert len(_messages(after)) < len(_messages(before)) / 2
    assert "the user greeted twelve times" in retry.system  # it carries the summary
    assert QUESTION in retry.messages[-1].text  # and the user's message, kept
    # The overflow's summary call is in the turn's trace and paid for by the turn.
    assert "summary" in [c.purpose for c in run.calls]
    assert run.turn.usage.input >= 300


def _messages(request: ChatRequest) -> str:
    return dumps([m.text for m in request.messages])
