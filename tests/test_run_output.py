"""What `heron run` tells a script (session 20, qa20l): stdout holds the reply as stored, even
when a stream was cut and retried; a reply the output cap cut says so."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from serve_helpers import running_serve

from heron.bus import RETRY_MARKER
from heron.channels.script import run_message, run_once
from heron.config import Settings
from heron.errors import FatalProviderError, TransientProviderError
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import StreamEvent
from heron.store import Store

DEAD = "hello there gene"  # what the cut attempt streamed before the connection dropped
FINAL = "The answer is 42."


class CutOnce(ScriptedProvider):
    """The first call streams DEAD and is cut (the retry then answers FINAL)."""

    def __init__(self) -> None:
        super().__init__(lambda request: Reply([Text(FINAL)], "done", Usage(10, 5)))
        self.cut = False

    async def chat(self, request, on_event=None):
        if not self.cut:
            self.cut = True
            if on_event:
                on_event(StreamEvent("text", DEAD))
            raise TransientProviderError("peer closed connection mid-stream")
        return await super().chat(request, on_event)


async def _run(provider, *, as_json: bool, served: bool) -> tuple[bool, str, str]:
    out, err = StringIO(), StringIO()
    if served:
        async with running_serve(provider):
            ok = await run_message(
                Settings.load, "hi", "default", "cut", None, False, out, err, as_json=as_json
            )
    else:
        ok = await run_once(
            Settings.load(),
            "hi",
            "default",
            "cut",
            None,
            False,
            out,
            err,
            provider,
            as_json=as_json,
        )
    return ok, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("served", [False, True])
async def test_json_reply_of_a_cut_and_retried_stream_is_the_reply_as_stored(served):
    ok, out, _ = await _run(CutOnce(), as_json=True, served=served)
    got = json.loads(out)
    assert ok and got["ok"] is True
    assert got["reply"] == FINAL  # not the dead attempt, nor the marker


@pytest.mark.parametrize("served", [False, True])
async def test_plain_stdout_not_a_terminal_holds_only_the_final_reply(served):
    ok, out, err = await _run(CutOnce(), as_json=False, served=served)
    assert ok and out == FINAL + "\n"
    assert "retrying" in err  # stderr says a retry happened


class Terminal(StringIO):
    def isatty(self) -> bool:
        return True


async def test_a_terminal_sees_the_dead_attempt_live_and_the_marker():
    out, err = Terminal(), StringIO()
    ok = await run_once(Settings.load(), "hi", "default", "cut", None, False, out, err, CutOnce())
    assert ok and out.getvalue() == f"{DEAD}\n{RETRY_MARKER}\n{FINAL}\n"


def _cut_by_the_cap(request) -> Reply:
    """Every call is cut by the output cap (finish_reason "length")."""
    return Reply([Text(f"Part {len(request.messages)}. ")], "length", Usage(10, 5))


@pytest.mark.parametrize("served", [False, True])
async def test_a_reply_the_output_cap_cut_says_it_is_incomplete_and_what_raises_the_cap(served):
    ok, out, err = await _run(ScriptedProvider(_cut_by_the_cap), as_json=True, served=served)
    got = json.loads(out)
    assert ok and got["ok"] is True and got["stop"] == "length"
    assert got["reply"].count("Part") == 3  # the reply and its two continuations
    said = " ".join(err.split())
    assert "incomplete" in said and "after 2 continuations" in said
    assert 'max_output under [models."scripted"]' in said and "max_continuations" in said


async def test_a_whole_reply_has_stop_done_and_no_notice():
    ok, out, err = await _run(
        ScriptedProvider(lambda r: Reply([Text("whole")], "done")), as_json=True, served=False
    )
    assert ok
    assert json.loads(out)["stop"] == "done" and "incomplete" not in err


def test_the_chat_shows_a_notice_with_brackets_as_written():
    """The cut reply's notice names `[agent] max_continuations`: Rich markup ate the brackets."""
    from rich.console import Console

    from heron.bus import OutboundMessage
    from heron.channels.terminal import ChatState, TerminalView

    screen = StringIO()
    view = TerminalView(Console(file=screen, width=200), ChatState("k", "default"))
    said = 'Raise max_output under [models."m"] or [agent] max_continuations in config.toml.'
    view.message(OutboundMessage("terminal", "", "k", said, "notice"))
    assert said in screen.getvalue()


def test_the_chat_says_stopped_after_the_text_the_stopped_turn_kept():
    """The offline model's answer comes whole as its turn ends; /stop's answer came first and
    was printed above the partial reply it refers to."""
    from rich.console import Console

    from heron.bus import STOP_ANSWER_CODE, OutboundMessage, TurnEnd, TurnEvent
    from heron.channels.terminal import ChatState, TerminalView

    screen = StringIO()
    view = TerminalView(Console(file=screen, width=200), ChatState("k", "default"))
    view.event(TurnEvent("terminal", "", "k", "turn_start", "tell me a story"))
    stopped = "Stopped. What the turn finished is kept."
    view.message(OutboundMessage("terminal", "", "k", stopped, "command", code=STOP_ANSWER_CODE))
    view.message(OutboundMessage("terminal", "", "k", "Once upon a time", "answer"))
    view.event(TurnEvent("terminal", "", "k", "turn_end", end=TurnEnd(False, "stale")))
    shown = screen.getvalue()
    assert shown.index("Once upon a time") < shown.index(stopped)
    assert view.prompt() == "› "  # the turn is over
    # The other order: the stopped turn ends, the message typed during it opens the next
    # turn, and then /stop's answer comes: said at once, before the next turn's reply.
    view.stopping = True
    view.event(TurnEvent("terminal", "", "k", "turn_start", "go on"))
    view.event(TurnEvent("terminal", "", "k", "turn_end", end=TurnEnd(False, "stale")))
    view.event(TurnEvent("terminal", "", "k", "turn_start", "and the second thing"))
    view.message(OutboundMessage("terminal", "", "k", stopped, "command", code=STOP_ANSWER_CODE))
    view.message(OutboundMessage("terminal", "", "k", "Answered the second thing.", "answer"))
    shown = screen.getvalue()
    assert shown.rindex(stopped) < shown.index("Answered the second thing.")


def test_each_tool_line_on_stderr_names_its_call_by_its_first_argument():
    """Four propose_lesson lines came out in the order the calls finished, with nothing to
    tell which was which (QA22x L13): each now names its first argument, cut short."""
    from io import StringIO

    from heron.bus import TurnEvent
    from heron.channels.script import ReplyPrinter
    from heron.messages import ToolCall, ToolResult

    err = StringIO()
    printer = ReplyPrinter(StringIO(), err)
    long_rule = "Always check the date of the meeting before writing the invitation email"
    for n, (args, failed) in enumerate(
        [
            ({"rule": long_rule, "topic": "email"}, True),
            ({"path": "a\x1b[2Jb.md"}, False),
            ({}, False),
        ]
    ):
        call = ToolCall(f"c{n}", "propose_lesson", args)
        result = ToolResult(call.id, "x", failed)
        printer.event(
            TurnEvent("script", "c", "k", "tool_end", call=call, result=result, seconds=0.25)
        )
    lines = err.getvalue().splitlines()
    assert lines[0] == '[propose_lesson error 0.2s: "Always check the date of the meeting be…"]'
    assert lines[1] == '[propose_lesson ok 0.2s: "a\\x1b[2Jb.md"]'  # escaped, never run
    assert lines[2] == "[propose_lesson ok 0.2s]"


class CutAndFailed(ScriptedProvider):
    """Streams DEAD, then fails for good (as the last of a cut stream's attempts does)."""

    def __init__(self) -> None:
        super().__init__(lambda request: Reply([Text(FINAL)], "done", Usage(10, 5)))

    async def chat(self, request, on_event=None):
        if on_event:
            on_event(StreamEvent("text", DEAD))
        raise FatalProviderError("the stream ended before the model finished its reply")


@pytest.mark.parametrize("served", [False, True])
@pytest.mark.parametrize("as_json", [False, True])
async def test_a_failed_turn_prints_none_of_its_dead_attempt(as_json, served):
    """A failed turn wrote its last attempt's partial text to stdout and to `reply`, which
    the record never holds (QA22u L1): a script's `> answer.txt` kept half a sentence."""
    ok, out, err = await _run(CutAndFailed(), as_json=as_json, served=served)
    assert not ok
    reply = json.loads(out)["reply"] if as_json else out
    assert reply == ""
    said = json.loads(out)["error"] if as_json else err
    assert "the stream ended before the model finished its reply" in said
    store = Store(Settings.load().paths.db)
    try:
        conversation = store.conversation("cut")
        assert conversation is not None
        texts = [row.message.text for row in store.branch(conversation.id)]
    finally:
        store.close()
    assert texts == ["hi"]  # the record has none of the dead attempt either
