"""`heron run` through a `heron serve`: a follow-up mailed into a running turn prints from the
reply that reads it (qa21s #5), and a serve that dies mid-turn (kill -9, a crash): it says what
happened in a sentence, that what streamed since the last tool call was not saved, and, for a
serve without workers (nothing will finish that turn), that `heron run --retry` answers the
message once the serve runs again. `--json` gives as `reply` only what the record holds, and
what streamed beside it in `unsaved_reply` (qa21s #2)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from heron import versions
from heron.bus import MAIL_BREAK, TurnEnd, TurnEvent
from heron.channels.script import ReplyPrinter, _said, run_remote
from heron.messages import ToolCall, ToolResult

KEY = "sk"


def _streamed(*, tool: bool) -> list[dict[str, Any]]:
    """What the serve sends about our turn before it dies: its start (the message stored), a
    reply with a tool call (stored with the call) when `tool`, then text never stored."""
    said: list[dict[str, Any]] = [{"type": "turn_start", "message_id": 7, "text": "q"}]
    if tool:
        said += [
            {"type": "delta", "text": "Let me look. "},
            {"type": "tool_start", "call_id": "c1", "name": "bash", "args": {}},
            {"type": "tool_end", "call_id": "c1", "name": "bash", "result": "ok", "seconds": 0.1},
        ]
    return [*said, {"type": "delta", "text": "ANSWER to ['MSG-sk1'] lo"}]


@asynccontextmanager
async def _dying_serve(
    folder: Path, events: list[dict[str, Any]], workers: bool, **about: Any
) -> AsyncIterator[Path]:
    """A control socket that welcomes the client (saying `about` of itself too: `embedded`),
    answers its message with `events`, then closes as a killed serve's does."""

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()  # hello
        welcome = {"type": "welcome", "conversation": KEY, "seq": 0, "busy": False}
        welcome.update(chat_id="c1", schema=versions.newest_step(), **about)  # this very Heron
        if workers:
            welcome["workers"] = {"alive": 1}
        writer.write(json.dumps(welcome).encode() + b"\n")
        await reader.readline()  # the message
        for event in events:
            said = {"conversation": KEY, "chat_id": "c1", **event}
            writer.write(json.dumps(said).encode() + b"\n")
        await writer.drain()
        writer.close()  # killed: no turn_end ever comes

    path = folder / "control.sock"
    server = await asyncio.start_unix_server(client, str(path))
    async with server:
        yield path


async def _run(
    tmp_path: Path, *, tool: bool, workers: bool, as_json: bool
) -> tuple[bool, str, str]:
    out, err = StringIO(), StringIO()
    async with _dying_serve(tmp_path, _streamed(tool=tool), workers) as path:
        ok = await run_remote(path, "q", "default", KEY, out, err, as_json=as_json)
    return ok, out.getvalue(), err.getvalue()


async def test_a_serve_killed_mid_reply_says_so_in_a_sentence_and_how_to_answer_again(tmp_path):
    ok, out, err = await _run(tmp_path, tool=False, workers=False, as_json=False)
    assert not ok
    assert "the turn was its end" not in err and "may still finish" not in err
    assert "heron serve stopped before the turn ended; what streamed was not saved" in err
    assert f"Start heron serve again; `heron run --retry -c {KEY}` answers your message." in err
    assert err.count("heron serve stopped") == 1
    assert "What it finished is kept" not in err
    assert out == ""  # a pipe gets the reply as stored: none of it is


async def test_after_a_tool_call_only_what_streamed_since_is_said_lost(tmp_path):
    ok, out, err = await _run(tmp_path, tool=True, workers=False, as_json=False)
    assert not ok
    assert "what streamed since its last tool call was not saved" in err
    assert out == "Let me look. \n"  # stored with its tool call


@pytest.mark.parametrize("tool", [False, True])
async def test_json_reply_holds_only_what_the_record_holds(tmp_path, tool):
    ok, out, _ = await _run(tmp_path, tool=tool, workers=False, as_json=True)
    got = json.loads(out)
    assert not ok and got["ok"] is False
    assert got["reply"] == ("Let me look. \n" if tool else "")
    assert got["unsaved_reply"] == "ANSWER to ['MSG-sk1'] lo"
    assert "not saved" in got["error"] and "--retry" in got["hint"]


async def test_with_workers_the_turn_may_still_finish(tmp_path):
    ok, _, err = await _run(tmp_path, tool=False, workers=True, as_json=False)
    assert not ok
    assert "heron serve stopped before the turn ended; on a worker of the serve" in err
    assert "may still finish" in err and f"heron conversations show {KEY}" in err
    assert "the turn was its end" not in err


async def test_a_serve_killed_after_taking_the_message_as_mail_says_it_is_kept(tmp_path):
    """The serve writes mail to disk before it says "mail" (heron/store/held.py), and the next
    serve shows it as a message with no answer: `heron run` said it "may not be saved"
    (QA22t #4), where `heron chat` said it was kept."""
    out, err = StringIO(), StringIO()
    mailed = [{"type": "status", "state": "mail", "text": "q"}]
    async with _dying_serve(tmp_path, mailed, workers=False) as path:
        ok = await run_remote(path, "q", "default", KEY, out, err)
    said = err.getvalue()
    assert not ok and "may not be saved" not in said
    assert f"Start heron serve again; `heron run --retry -c {KEY}` answers your message." in said


# ---- a follow-up that joined a running turn as mail ------------------------------------------


def _mailed(*events: TurnEvent) -> str:
    """What a follow-up's `heron run` prints once its message went to the running turn and
    that turn went on with `events`, then ended."""
    printer = ReplyPrinter(StringIO(), StringIO(), key=KEY, served=True)
    printer.event(TurnEvent("script", "c1", KEY, "mail", "MSG-b follow-up"))
    for event in events:
        printer.event(event)
    printer.event(TurnEvent("script", "c1", KEY, "turn_end", end=TurnEnd(True, "done")))
    _said(printer, KEY)
    return printer.out.getvalue()  # type: ignore[attr-defined]


def _delta(text: str) -> TurnEvent:
    return TurnEvent("script", "c1", KEY, "delta", text)


def _tool_end() -> TurnEvent:
    call = ToolCall("c1", "bash", {})
    return TurnEvent("script", "c1", KEY, "tool_end", call=call, result=ToolResult("c1", "ok"))


def test_a_follow_up_prints_from_the_reply_that_reads_it_not_another_messages_tail():
    """qa21s #5: it began with `m ipsum lorem ipsum ||ANSWER to ['MSG-b']`."""
    tail = _delta("m ipsum lorem ipsum")  # the end of the answer to the first message
    assert _mailed(tail, _delta(MAIL_BREAK), _delta("ANSWER to ['MSG-b']")) == (
        "ANSWER to ['MSG-b']\n"
    )
    assert _mailed(tail, _tool_end(), _delta("ANSWER to ['MSG-b']")) == "ANSWER to ['MSG-b']\n"


def test_a_turn_that_ends_with_no_point_seen_where_it_read_the_mail_prints_its_reply():
    """The mail joined just after the last tool phase, before the drain that read it: what
    streamed since is the reply that answers it."""
    assert _mailed(_delta("ANSWER to "), _delta("['MSG-b']")) == "ANSWER to ['MSG-b']\n"


# ---- mail the running turn never read (qa24g M3) --------------------------------------------


def _carried(*, told: bool) -> list[dict[str, Any]]:
    """Our message mailed into another client's turn (chat c0) that fails unread; with `told`
    the serve says so, and the next turn (joined, led by c0's chat) answers it."""
    carried = [{"type": "status", "state": "carried"}] if told else []
    failed = {"type": "turn_end", "chat_id": "c0", "ok": False, "outcome": "failed"}
    return [
        {"type": "status", "state": "mail", "text": "second question"},
        {"type": "delta", "chat_id": "c0", "text": "first SL"},
        *carried,
        {**failed, "error": "the model server sent nothing for 3 s", "run_id": "run_other"},
        {"type": "turn_start", "chat_id": "c0", "message_id": 9, "text": "second question"},
        {"type": "delta", "chat_id": "c0", "text": "reply to: second question"},
        {"type": "turn_end", "chat_id": "c0", "ok": True, "outcome": "done", "run_id": "run_ours"},
    ]


async def test_mail_the_running_turn_never_read_is_answered_by_the_next_turn_it_waits_for(
    tmp_path,
):
    """It took the failed turn's end (another message's) for its own: ok false, that run's id
    and error, and a --retry hint that answered its message twice."""
    out, err = StringIO(), StringIO()
    async with _dying_serve(tmp_path, _carried(told=True), workers=False) as path:
        ok = await run_remote(path, "second question", "default", KEY, out, err, as_json=True)
    got = json.loads(out.getvalue())
    assert ok and got["ok"] is True, got
    assert got["reply"] == "reply to: second question"
    assert got["run_id"] == "run_ours" and not got.get("hint")
    assert "ended without reading your message; the next turn answers it" in err.getvalue()
