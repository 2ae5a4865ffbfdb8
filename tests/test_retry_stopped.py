"""`heron run --retry` after a /stop, a Ctrl-C or a crash answers the stopped message where it
stands, as after a failed turn: it is not stored a second time, and the partial reply the
person read and the tool work stay in view (qa21s #3). The chat's `/retry` still branches, as
documented. `conversations show` lists every turn its header counts."""

from __future__ import annotations

import contextlib
import io

from heron.agent.turn import REPLY_STOPPED
from heron.bus import ALREADY_ANSWERED
from heron.channels.info import show_conversation
from heron.config import Settings
from heron.messages import Message, Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.store import Store
from heron.store import engine_state as es

PARTIAL = f"The first half of the ans\n\n{REPLY_STOPPED}"


def _ok(text: str) -> Reply:
    return Reply([Text(text)], "done", Usage(10, 2))


def _stopped(store: Store, key: str, text: str) -> None:
    """A turn a /stop (or Ctrl-C) closed mid-reply, as the stop leaves it: the message, what
    streamed as the model's interrupted reply, the turn row interrupted."""
    conversation = store.open_conversation(key)
    turn_id, _ = store.begin_turn(
        conversation.id, f"run_{key}_stopped", Message("user", [Text(text)])
    )
    es.close_turn(store, conversation.id, turn_id, PARTIAL, author="model")


def _texts(store: Store, key: str) -> list[tuple[str, str | None, str]]:
    conversation = store.conversation(key)
    assert conversation is not None
    return [(r.role, r.author, r.message.text) for r in store.branch(conversation.id)]


async def test_run_retry_after_a_stop_answers_the_message_where_it_stands():
    from heron.agent.engine import Engine

    provider = ScriptedProvider([_ok("first answer"), _ok("the whole answer")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("rt", "hello")
        _stopped(engine.store, "rt", "SLOW question")
        retried = await engine.turn("rt", "/retry unanswered")
        again = await engine.turn("rt", "/retry unanswered")
        store = engine.store
        conversation = store.conversation("rt")
        every = [m.message.text for m in store.all_messages(conversation.id)]
        rows = _texts(store, "rt")
    assert retried.ok and retried.text == "the whole answer"
    assert every.count("SLOW question") == 1  # stored once: no new branch
    assert rows[2:4] == [("user", "user", "SLOW question"), ("assistant", "model", PARTIAL)]
    assert rows[-1] == ("assistant", "model", "the whole answer")
    assert rows[-2][:2] == ("user", "heron")  # Heron's own note that it is asked again
    # The model read the stopped reply the person saw, and the message once.
    sent = provider.requests[-1].messages
    assert any(m.role == "assistant" and "The first half" in m.text for m in sent)
    assert sum("SLOW question" in m.text for m in sent if m.role == "user") == 1
    assert sent[-1].role == "user"  # the request ends with the user's side, never a prefill
    assert again.text == ALREADY_ANSWERED  # answered now: the next --retry refuses


async def test_chat_retry_after_a_stop_still_starts_a_new_branch():
    from heron.agent.engine import Engine

    provider = ScriptedProvider([_ok("again")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        _stopped(engine.store, "ch", "question")
        await engine.turn("ch", "/retry")
        conversation = engine.store.conversation("ch")
        every = [m.message.text for m in engine.store.all_messages(conversation.id)]
        rows = _texts(engine.store, "ch")
    assert every.count("question") == 2  # the old answer stays on its branch
    assert rows == [("user", "user", "question"), ("assistant", "model", "again")]


def _shown(key: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        show_conversation(Settings.load(), key)
    return out.getvalue()


async def test_show_lists_every_turn_its_header_counts_and_names_other_branches():
    from heron.agent.engine import Engine

    provider = ScriptedProvider([_ok("one"), _ok("two"), _ok("two again")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("br", "first")
        await engine.turn("br", "second")
        await engine.turn("br", "/retry")  # the chat's retry: "two" stays on its branch
    shown = _shown("br")
    header = shown.splitlines()[0]
    assert "2 turns" in header and "1 more on another branch" in header
    assert shown.count("── turn ") == 2
    assert "two again" in shown and "assistant: two\n" not in shown


async def test_show_heads_a_retry_that_failed_again_and_wrote_no_row():
    from heron.agent.engine import Engine
    from heron.errors import AuthError

    provider = ScriptedProvider([AuthError("bad key"), AuthError("bad key"), _ok("at last")])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("fa", "question")
        await engine.turn("fa", "/retry unanswered")
        await engine.turn("fa", "/retry unanswered")
    shown = _shown("fa")
    assert "3 turns" in shown.splitlines()[0]
    headers = [line.split(" · ")[2] for line in shown.splitlines() if line.startswith("── turn")]
    assert headers == ["failed", "failed", "done"]


def test_show_says_a_turn_whose_process_ended_is_no_longer_running():
    import os

    from test_serve_restart import _dead_pid, _left_running  # a killed process's turn

    pid = _dead_pid()
    _left_running("k8", pid)
    shown = _shown("k8")
    assert f"running? (its process {pid} has ended; the next turn closes it)" in shown
    _left_running("alive", os.getpid())  # a live process's turn runs: said as it is
    assert " · running · " in _shown("alive")
