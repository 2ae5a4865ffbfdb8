"""Auto-recall never passes Heron's own rows off as the person's, and does not search for a turn
Heron opened: a reminder's prompt recalled in another conversation is labelled `heron`, not
`user`, and a reminder's, monitor's or goal nudge's own message recalls nothing (its runtime
notes still reach it)."""

from __future__ import annotations

import re

import pytest
from test_memory_engine import _filler

from heron.agent.control import TurnControl
from heron.agent.engine import Engine
from heron.agent.turn import TurnHooks
from heron.config import Settings
from heron.messages import Message, Reply, Text, assistant
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest

pytestmark = pytest.mark.usefixtures("home_db")

PROMPT = "[Scheduled reminder, job 2. The user asked for this earlier; tell them now.]"
REMINDER = f"{PROMPT} Renew the passport at the town hall before the trip to Porto."
ASKED = "When do I renew the passport at the town hall for Porto?"


@pytest.fixture(autouse=True)
def no_embeddings(monkeypatch):
    monkeypatch.setenv("HERON_EMBEDDINGS", "0")  # these tests are about labels and wiring


def seed(engine: Engine) -> int:
    """Another conversation: filler, then a reminder's prompt (Heron's row, as the turn stores a
    reminder's message) and the reply to it. Returns the prompt row's id."""
    _filler(engine)  # another conversation, "old", of 300 messages
    store = engine.store
    old = store.open_conversation("old")
    row = store.append(
        old.id, Message("user", [Text(REMINDER)]), meta={"injected_event": "reminder"}
    )
    assert row.author == "heron"
    store.append(old.id, assistant("Reminder: the passport, town hall, before Porto."))
    return row.id


def recalled(request: ChatRequest) -> str | None:
    """The auto-recall result the request carries before its last message, if any."""
    for message in request.messages:
        for call in message.tool_calls:
            if call.name == "recall_history":
                index = request.messages.index(message)
                return request.messages[index + 1].tool_results[0].content
    return None


async def test_a_reminder_prompt_recalled_elsewhere_is_labelled_heron_not_user():
    provider = ScriptedProvider(lambda _: Reply([Text("ok")], "done"))
    async with Engine.open(Settings.load(), provider=provider) as engine:
        row_id = seed(engine)
        await engine.turn("new", ASKED)
    content = recalled(provider.requests[0])
    assert content is not None, "the person's question recalls the reminder"
    (line,) = [x for x in content.splitlines() if f"message {row_id} ·" in x]
    assert re.search(rf"· message {row_id} · heron\]", line), line
    assert "· user]" not in line


@pytest.mark.parametrize("provenance", ["reminder", "scheduled", "goal"])
async def test_a_turn_heron_opened_gets_no_auto_recall_but_keeps_its_runtime_notes(provenance):
    provider = ScriptedProvider(lambda _: Reply([Text("ok")], "done"))
    async with Engine.open(Settings.load(), provider=provider) as engine:
        seed(engine)
        engine.attached.runtime_notes = lambda key: "Goal: unchanged (3 turns left)."
        control = TurnControl("busy2", provenance)
        await engine.turn("busy2", f"{PROMPT} {ASKED}", TurnHooks(control=control))
        await engine.turn("mine", ASKED)  # the person's own words: searched as ever
    heron_opened, persons = provider.requests
    assert recalled(heron_opened) is None
    assert "Goal: unchanged (3 turns left)." in heron_opened.messages[-1].text
    assert recalled(persons) is not None
