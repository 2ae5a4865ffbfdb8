"""Ctrl-D (or /exit) in `heron chat` while its own turn runs. Through a serve the chat only
leaves: the turn goes on and the other clients see it end (QA: it sent /stop, and the browser
said "Stopped by /stop from heron chat"). In this process nothing would run it after the
chat: it is stopped, and the chat says so."""

from __future__ import annotations

import asyncio
from io import StringIO

from rich.console import Console
from serve_helpers import running_serve, ws_client, ws_hello, ws_until
from test_engine_loop import _gate_registry
from waiting import until

from heron.agent.engine import Engine
from heron.channels import terminal
from heron.channels.inprocess import connect
from heron.channels.remote import connect_remote, serve_socket
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider


def _script() -> ScriptedProvider:
    return ScriptedProvider(
        [Reply([ToolCall("c1", "wait_gate", {})], "tool"), Reply([Text("Finished.")], "done")]
    )


def _chat() -> tuple[StringIO, terminal.ChatState, terminal.TerminalView]:
    screen = StringIO()
    state = terminal.ChatState("personal", "default")
    return screen, state, terminal.TerminalView(Console(file=screen, width=200), state)


async def test_ctrl_d_through_a_serve_leaves_and_the_turn_goes_on_for_the_other_clients():
    registry, gate, _ = _gate_registry()
    provider = _script()
    screen, state, view = _chat()
    async with running_serve(provider, registry) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "personal")
        path = serve_socket()
        assert path is not None
        async with connect_remote(path, "terminal", view.deliver, "personal") as conn:
            view.chat_id = conn.chat_id or ""
            await conn.send("do the long thing", "personal")
            await until(lambda: len(provider.requests) == 1)
            await until(lambda: conn.running("personal"))
            await asyncio.wait_for(terminal._leave(conn, state, view), 10)
        await asyncio.sleep(0.2)  # a /stop, had one been sent, has reached the turn by now
        gate.set()
        browser = await ws_until(ws, "turn_end")
    end = browser[-1]
    assert end["ok"] and not end["interrupted"] and end["stopped_by"] is None
    assert end["reply"] == "Finished."
    said = screen.getvalue()
    assert terminal.GOES_ON.format(key="personal") in said and said.rstrip().endswith("Bye.")


async def test_ctrl_d_in_process_stops_the_turn_and_says_so():
    registry, _, _ = _gate_registry()
    provider = _script()
    screen, state, view = _chat()
    async with Engine.open(Settings.load(), provider=provider, registry=registry) as engine:
        async with connect(engine, "terminal", "pid1", view.deliver) as conn:
            view.chat_id = "pid1"
            await conn.send("do the long thing", "personal")
            await until(lambda: len(provider.requests) == 1)
            await asyncio.wait_for(terminal._leave(conn, state, view), 10)
        status = engine.store.query("SELECT status FROM turns")[0][0]
    assert status == "interrupted"
    assert terminal.STOPPED_ON_LEAVING in screen.getvalue().replace("\n", " ")


async def test_a_chats_mail_kept_as_the_serve_stops_is_said_in_that_chat_only():
    """The serve stops with the chat's mail unread: the chat says where it is kept; another
    chat of the conversation, whose message it is not, says nothing of it, but as it leaves
    says that its own message, whose turn the stop cut, is kept and what answers it."""
    registry, _, _ = _gate_registry()
    provider = _script()
    screen, _, view = _chat()
    other, _, other_view = _chat()
    async with running_serve(provider, registry) as serve:
        path = serve_socket()
        assert path is not None
        async with (
            connect_remote(path, "terminal", view.deliver, "personal") as conn,
            connect_remote(path, "terminal", other_view.deliver, "personal") as watcher,
        ):
            view.chat_id, other_view.chat_id = conn.chat_id or "", watcher.chat_id or ""
            await watcher.send("do the long thing", "personal")
            await until(lambda: len(provider.requests) == 1)
            await conn.send("and this too", "personal")
            await until(lambda: "added to the running turn" in screen.getvalue())
            serve.stop.set()
            await asyncio.wait_for(serve.task, 30)
            await until(lambda: conn.gone)
            kept = watcher.kept_unanswered()  # its own turn's message, stored, was cut short
    said = screen.getvalue().replace("\n", " ")
    assert "heron serve stopped before your message was answered" in said
    assert "--retry -c personal" in said and conn.unanswered
    assert "before your message was answered" not in other.getvalue()
    # The chat whose turn it was says so as it leaves, and what answers it (QA21s 10).
    _, watcher_state, _ = _chat()
    watcher_state.kept_on_gone = kept
    note = terminal.serve_gone_note(watcher_state)
    assert "before your message was answered" in note and "conversation 'personal'" in note
    assert "/retry" in note and "heron run --retry -c personal" in note
    assert "kept" not in terminal.serve_gone_note(_chat()[1])  # nothing of its own in flight


def test_leaving_a_chat_through_a_serve_says_who_reviews_it_for_memory(heron_home):
    """Through a serve the chat's end started no review and said nothing (memory.md promises
    the review or one line saying why)."""
    _, state, _ = _chat()
    assert terminal.serve_review_note(Settings.load(), state) is None  # nothing talked about
    state.keys.append("personal")
    said = terminal.serve_review_note(Settings.load(), state)
    assert said is not None and "nightly review at 03:00 reads it" in said and "/learn" in said
    (heron_home / "config.toml").write_text("[review]\nenabled = false\n")
    assert "no nightly review is on" in (terminal.serve_review_note(Settings.load(), state) or "")
    (heron_home / "config.toml").write_text("[memory]\nreview_on_close = false\n")
    assert terminal.serve_review_note(Settings.load(), state) is None
