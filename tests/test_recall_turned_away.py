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
from heron.messages import Reply, Text, ToolCall
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
        shown = list(render_show(engine.store, run, PriceTable(), "UTC"))
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


TEAL = "My favourite colour is teal and my cat is called Biscuit."
ORANGE = "My favourite colour is orange and my dog is called Waffles."
NICE = Reply([Text("Nice.")], "done")


async def test_an_edited_away_message_is_not_recalled_in_another_conversation():
    """The old text of an /edit was injected by auto-recall in another conversation, and
    returned by recall_history there."""
    ask = Reply([ToolCall("r1", "recall_history", {"query": "favourite colour cat"})], "tool")
    model = Model([NICE, NICE, NICE, ask])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("br", TEAL)
        await engine.turn("br", "/edit 1 " + ORANGE)
        await engine.turn("quiz", "what colour is my favourite and what is my cat called?")
        await engine.turn("quiz2", "do you remember my favourite colour and my pet?")
    assert "Biscuit" not in recalled(model.requests[2])  # it was injected, above 0.7
    looked_up = model.requests[-1].messages[-1].tool_results[0].content
    assert "Waffles" in looked_up and "Biscuit" not in looked_up


async def test_memory_recall_leaves_an_edited_away_message_out_and_search_marks_it():
    """`heron memory recall` (what recall gives the model) leaves the old text of an /edit
    out; `conversations search` (the record) finds it, marked as on another branch."""
    from heron.channels.memory_cli import print_recall

    model = Model([NICE, NICE])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("br", TEAL)
        await engine.turn("br", "/edit 1 " + ORANGE)
        store = engine.store
        query = "favourite colour teal cat Biscuit"
        with _captured() as memory:
            print_recall(store, query, 10, standing=True)
        with _captured() as search:
            print_recall(store, query, 10)
        with _captured() as as_json:
            print_recall(store, query, 10, as_json=True)
    assert "Biscuit" not in memory.text and "Waffles" in memory.text
    old = next(line for line in search.text.splitlines() if "Biscuit" in line)
    new = next(line for line in search.text.splitlines() if "Waffles" in line)
    assert "on another branch" in old and "another branch" not in new
    flags = {h["snippet"]: h["on_branch"] for h in json.loads(as_json.text)}
    assert flags[TEAL] is False and flags[ORANGE] is True


class _captured:
    """What typer.echo printed inside the block, as `text`."""

    def __enter__(self) -> _captured:
        import typer

        self.text = ""
        self._patch = pytest.MonkeyPatch()
        self._patch.setattr(typer, "echo", self._echo)
        return self

    def _echo(self, message: object = "", **_: object) -> None:
        self.text += f"{message}\n"

    def __exit__(self, *exc: object) -> None:
        self._patch.undo()


async def test_a_quote_from_an_edited_away_message_is_refused():
    """manage_memory accepted the old text of an /edit as the person's words ("Saved ...")."""
    quote = TEAL.rstrip(".")
    save = Reply(
        [ToolCall("m1", "manage_memory", {"action": "create", "path": "personal/always/cat",
                                          "quote": quote})],
        "tool",
    )  # fmt: skip
    model = Model([NICE, NICE, save])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("br", TEAL)
        await engine.turn("br", "/edit 1 " + ORANGE)
        await engine.turn("br", "please save what I told you about my pet")
        saved = engine.memory.entries() if engine.memory else []
    result = model.requests[-1].messages[-1].tool_results[0]
    assert result.is_error
    assert "another branch" in result.content
    assert not saved


async def test_a_statement_the_person_had_forgotten_is_never_recalled():
    """After a forget, "Am I allergic to peanuts?" in a new conversation was answered with
    "I am allergic to peanuts" as evidence; a statement said again after the forget is the
    person's anew and is recalled."""
    from heron.memory.recall import Recall

    quote = "I am allergic to peanuts"
    save = Reply(
        [ToolCall("m1", "manage_memory", {"action": "create", "path": "personal/always/peanuts",
                                          "quote": quote})],
        "tool",
    )  # fmt: skip
    model = Model([save])
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("food", f"{quote}, remember that.")
        assert engine.memory is not None
        engine.memory.forget("personal/always/peanuts.md")
        await engine.turn("ask", "Am I allergic to peanuts?")
        assert "peanuts" not in recalled(model.requests[-1])
        standing = Recall(engine.store).search("allergic to peanuts", 10, standing=True)
        await engine.turn("food2", "Sadly I am allergic to peanuts after all, the test said so.")
        again = Recall(engine.store).search("allergic to peanuts", 10, standing=True)
    assert standing and all("remember that" not in h.snippet for h in standing)
    assert any("after all" in h.snippet for h in again)


@pytest.mark.parametrize(
    ("said", "later", "question"),
    [
        (  # "that is no longer true", said right after, was left out
            "I have been a strict vegetarian since 2019.",
            "Update: that is no longer true, I eat fish again.",
            "Since when am I a strict vegetarian?",
        ),
        (  # qa22v M3: "Actually no, ..." was not read as a correction
            "I moved to Porto last month.",
            "Actually no, I moved to Braga last month.",
            "Where did I move to last month, Porto?",
        ),
    ],
)
async def test_a_statement_taken_back_in_words_is_recalled_with_the_correction(
    said: str, later: str, question: str
):
    """The old claim came back alone as evidence, without the correction said right after."""
    model = Model()
    async with Engine.open(Settings.load(), provider=ScriptedProvider(model)) as engine:
        await engine.turn("said", said)
        await engine.turn("said", later)
        await engine.turn("ask", question)
    lines = recalled(model.requests[-1]).splitlines()
    hit = next(i for i, line in enumerate(lines) if said.rstrip(".") in line)
    assert lines[hit + 1].startswith("  ↳ later: [said · ")
    assert later.rstrip(".") in lines[hit + 1]


async def test_a_later_correction_the_search_also_matched_is_shown_under_the_hit():
    """A correction said later, not right after, that the search matched but did not show
    (here it ranks below the first statement, and one hit is asked for)."""
    from heron.memory.recall import Recall

    async with Engine.open(Settings.load(), provider=ScriptedProvider(Model())) as engine:
        await engine.turn("diet", "I am a strict vegetarian.")
        await engine.turn("diet", "What should we cook this weekend for the guests?")
        await engine.turn(
            "diet",
            "Ok so I am not a strict vegetarian anymore, since last summer I eat fish and "
            "chicken again at home with the family.",
        )
        (hit,) = Recall(engine.store).search("strict vegetarian", 1, standing=True)
    assert hit.snippet == "I am a strict vegetarian."
    assert hit.later is not None and "anymore" in hit.later.snippet
    assert hit.lines()[1].startswith("  ↳ later: [diet · ")
