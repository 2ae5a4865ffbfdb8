"""The AgentLoop as a process stops (`close`): no turn starts once it begins, and what the person
sent that no turn read (mail still in the mailbox, messages queued behind the turn, a message
arriving meanwhile) is kept as their words, unanswered, each sender told so; mail a /stop
overtook keeps each follow-up's channel label. A real serve and SIGTERM:
tests/test_serve_shutdown.py."""

from __future__ import annotations

import asyncio

from test_engine_loop import _gate_registry
from waiting import until

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import UNANSWERED_CODE, InboundMessage, MessageBus, OutboundMessage
from heron.config import Settings
from heron.messages import File, Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider


def _outbound(bus: MessageBus) -> list[OutboundMessage]:
    items = []
    while not bus.outbound.empty():
        item = bus.outbound.get_nowait()
        if isinstance(item, OutboundMessage):
            items.append(item)
    return items


async def test_close_starts_no_turn_and_keeps_unread_mail_and_queued_messages_unanswered():
    registry, _, _ = _gate_registry()
    provider = ScriptedProvider(
        [Reply([ToolCall("c1", "wait_gate", {})], "tool"), Reply([Text("Both read.")], "done")]
    )
    bus = MessageBus()
    notes = File("text/plain", b"line one\n", name="notes.txt")
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("script", "r1", "turn seven", "p", events=True))
        await until(lambda: len(provider.requests) == 1)
        await loop.dispatch(InboundMessage("script", "r2", "mail seven", "p", events=True))
        await loop.dispatch(InboundMessage("web", "w2", "web mail", "p", events=True))
        queued = InboundMessage("script", "r3", "queued words", "p", events=True, files=(notes,))
        await loop.dispatch(queued)  # with a file: it waits for a turn of its own
        assert loop.pending("p") == 1
        await loop.close()
        await loop.dispatch(InboundMessage("web", "w", "too late", "p", events=True))
        store = engine.store
        conversation = store.conversation("p")
        rows = store.branch(conversation.id)
        running = store.query("SELECT COUNT(*) FROM turns WHERE status = 'running'")[0][0]
        said = _outbound(bus)
        assert len(provider.requests) == 1  # no turn started for what waited
        assert running == 0
        last = rows[-1]
        assert last.role == "user" and last.author == "user" and last.turn_id is None
        assert "mail seven" in last.message.text and "queued words" in last.message.text
        assert "line one" in last.message.text  # the queued message's file came with it
        told = {m.chat_id: m.text for m in said if m.code == UNANSWERED_CODE}
        assert set(told) == {"r2", "w2", "r3", "w"}
        assert "kept in conversation 'p'" in told["r2"] and "--retry -c p" in told["r2"]
        # the browser's person answers it there (QA22t #6): no command line of a terminal
        assert "/retry" in told["w2"] and "heron run" not in told["w2"]
        assert "kept" in told["r3"] and "not taken" in told["w"]  # after the store: not kept
        # Each kept one names the row that keeps it, for the browser to place its notice
        # after it (QA22t #6: it sat above the message it spoke of).
        rows_told = {m.chat_id: m.message_id for m in said if m.code == UNANSWERED_CODE}
        assert rows_told == {"r2": last.id, "w2": last.id, "r3": last.id, "w": None}

        again = AgentLoop(engine, MessageBus())
        await again.dispatch(InboundMessage("script", "r4", "/retry unanswered", "p"))
        await again.wait_idle()
        rows = store.branch(conversation.id)
    asked = provider.requests[-1].messages[-1].text
    assert len(provider.requests) == 2 and "mail seven" in asked  # --retry answered it
    assert rows[-1].message.text == "Both read." and rows[-2].id == last.id


async def test_mail_a_stop_overtook_keeps_each_follow_ups_channel():
    """Mail from the phone and from the terminal, overtaken by a /stop, opens the next turn as
    the first sender's message (heard on its channel and chat, so the terminal does not see its
    own words as another client's), with the terminal's words labelled as mail from it."""
    registry, _, _ = _gate_registry()
    provider = ScriptedProvider(
        [Reply([ToolCall("c1", "wait_gate", {})], "tool"), Reply([Text("Read both.")], "done")]
    )
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, bus)
        await loop.dispatch(InboundMessage("web", "laptop", "SLOW turn", "p", events=True))
        await until(lambda: len(provider.requests) == 1)
        await loop.dispatch(InboundMessage("terminal", "chat", "chat mail five", "p", events=True))
        await loop.dispatch(InboundMessage("web", "phone", "phone mail five", "p", events=True))
        await loop.dispatch(InboundMessage("web", "laptop", "/stop", "p", events=True))
        await loop.wait_idle()
        rows = engine.store.branch(engine.store.conversation("p").id)
    starts = []
    while not bus.outbound.empty():
        item = bus.outbound.get_nowait()
        if not isinstance(item, OutboundMessage) and item.kind == "turn_start":
            starts.append(item)
    mine = next(r for r in rows if "chat mail five" in r.message.text)
    assert mine.message.text == (
        "chat mail five\n\n[sent while you were working, from web] phone mail five"
    )
    assert (starts[-1].channel, starts[-1].chat_id) == ("terminal", "chat")
    assert "Channel: terminal" in provider.requests[-1].messages[-1].text


async def test_a_goal_nudge_waiting_at_close_is_not_started_nor_kept_as_the_persons():
    registry, _, _ = _gate_registry()
    provider = ScriptedProvider([Reply([ToolCall("c1", "wait_gate", {})], "tool")])
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        loop = AgentLoop(engine, MessageBus())
        await loop.dispatch(InboundMessage("web", "w", "work", "p"))
        await until(lambda: len(provider.requests) == 1)
        loop.start_turn(InboundMessage("goal", "g", "[nudge]", "p", "goal"))
        await asyncio.wait_for(loop.close(), 10)
        rows = engine.store.branch(engine.store.conversation("p").id)
    assert len(provider.requests) == 1
    assert not any("[nudge]" in r.message.text for r in rows)


async def test_a_message_whose_keeping_fails_is_told_not_kept_and_to_send_it_again():
    """At shutdown a sender hears "kept" only once its words are written; a write the store
    refuses (a full disk) is said as it is: not kept, send it again. Another conversation's
    words are kept all the same."""
    from pathlib import Path

    from heron.store.disk import disk_full

    registry, _, _ = _gate_registry()
    provider = ScriptedProvider(lambda _: Reply([ToolCall("c1", "wait_gate", {})], "tool"))
    bus = MessageBus()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        store = engine.store
        loop = AgentLoop(engine, bus)
        for key in ("full", "fine"):
            await loop.dispatch(InboundMessage("script", f"{key}-1", "work", key, events=True))
        await until(lambda: len(provider.requests) == 2)
        for key in ("full", "fine"):
            await loop.dispatch(InboundMessage("script", key, f"{key} words", key, events=True))
        append, emit = store.append, bus.emit
        order: list[tuple[str, str]] = []  # what was written and told, in order

        def refusing(conversation_id, message, *args, **kwargs):
            if kwargs.get("author") == "user" and message.text.startswith("full words"):
                raise disk_full(Path("heron.db"))
            if kwargs.get("author") == "user":
                order.append(("written", message.text))
            return append(conversation_id, message, *args, **kwargs)

        def telling(item):
            if isinstance(item, OutboundMessage) and item.code == UNANSWERED_CODE:
                order.append(("told", item.chat_id))
            emit(item)

        store.append = refusing  # type: ignore[method-assign]
        bus.emit = telling  # type: ignore[method-assign]
        await loop.close()
        said = {m.chat_id: m.text for m in _outbound(bus) if m.code == UNANSWERED_CODE}
        kept = [r.message.text for r in store.branch(store.conversation("fine").id)]
        lost = [r.message.text for r in store.branch(store.conversation("full").id)]
    assert "fine words" in kept and "full words" not in lost
    assert order.index(("written", "fine words")) < order.index(("told", "fine"))
    assert "kept in conversation 'fine'" in said["fine"]
    assert "it was not kept; send it again" in said["full"] and "disk" in said["full"]
    assert "kept in conversation 'full'" not in said["full"]
