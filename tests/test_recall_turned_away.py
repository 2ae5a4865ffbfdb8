"""Recall brings only what the person still stands by, and the trace shows what it brought.

- A message the person turned away from (the old text of an `/edit`, the answer `/retry`
  replaced, a branch `/tree` left) is never evidence: not for auto-recall in another
  conversation, not from `recall_history` or `heron memory recall`, not as a quote to save.
  `heron conversations search` still finds it (a search of the record), and says that it is
  on another branch.
- A statement the person had forgotten (`heron memory forget`, manage_memory delete) is never
  shown by recall; one they took back in words right after ("that is no longer true") is
  shown with the correction under it.
- `heron trace show` lists what auto-recall injected before the message.
"""

from __future__ import annotations

import json

import pytest

from heron.agent.engine import Engine
from heron.config import Settings
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.trace.prices import PriceTable
from heron.trace.read import load_run
from heron.trace.render import export_run, render_show
from heron.trace.scrub import Scrubber

pytestmark = pytest.mark.usefixtures("home_db")


@pytest.fixture(autouse=True)
def no_embeddings(monkeypatch):
    monkeypatch.setenv("HERON_EMBEDDINGS", "0")


class Model:
    """Replies in order, then "ok"; every request kept."""

    def __init__(self, replies: list[Reply] | None = None) -> None:
        self.replies = list(replies or [])
        self.requests: list[ChatRequest] = []

    def __call__(self, request: ChatRequest) -> Reply:
        self.requests.append(request)
        return self.replies.pop(0) if self.replies else Reply([Text("ok")], "done")


def recalled(request: ChatRequest) -> str:
    """What auto-recall injected into a request (its recall_history results)."""
    return "\n".join(
        r.content
        for m in request.messages
        for r in m.tool_results
        if r.call_id.startswith("recall_")
    )


async def test_trace_show_lists_what_auto_recall_injected_before_the_message():
    """`trace show` listed `you:`, the model call and the reply, and not the recall_history
    call and result auto-recall put before the message (`conversations show` and the request
    in `trace export` had them)."""
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("diet", "I have been a strict vegetarian since 2019, no meat at all.")
        result = await engine.turn("dinner", "Since when am I a strict vegetarian?")
        assert "strict vegetarian since 2019" in recalled(model.requests[-1])
        run = load_run(engine.store, result.run_id)
        shown = list(render_show(engine.store, run, PriceTable()))
        exported = json.loads(export_run(engine.store, result.run_id, Scrubber()))
    you = next(i for i, line in enumerate(shown) if line.startswith("you: "))
    call = next(i for i, line in enumerate(shown) if line.lstrip().startswith("#1 "))
    between = shown[you + 1 : call]
    assert between[0].lstrip().startswith("auto-recall")
    assert "recall_history(" in between[0]
    assert any("strict vegetarian since 2019" in line for line in between[1:])
    assert "From other conversations" in "\n".join(between)
    (injected,) = exported["auto_recall"]
    assert injected["name"] == "recall_history"
    assert "strict vegetarian since 2019" in injected["result"]
