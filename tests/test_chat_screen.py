"""What a person sees in the real `heron chat`: the chat runs in a pseudo-terminal (pexpect)
against a fake model server on loopback, and its output is played into a terminal emulator
(pyte's HistoryScreen, 80x24 with its scrollback), so each test asserts on the screen and the
scrollback, not on the bytes: a tall reply shown once, the spinner before the first token, text
typed during a turn kept out of the reply, Ctrl-C keeping what streamed, a mistyped command."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable

import pexpect
import pyte
import pytest
from serve_helpers import maybe_serve

from heron.agent.turn import REPLY_STOPPED
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow

ROWS, COLS = 24, 80
TIMEOUT = 120.0  # a bound, not a pace: a busy two-core machine starts Python slowly
# Forty short paragraphs, a blank line between each: 79 lines, over three screens.
TALL = "\n\n".join(f"Paragraph {n:02d} of the long answer." for n in range(1, 41))


def _env(url: str) -> dict[str, str]:
    return {"HERON_BASE_URL": url, "HERON_API_KEY": "dummy", "HERON_MODEL": "fake-model"}


class ChatScreen:
    """The real `heron chat` in a pty, its output played into an 80x24 terminal emulator."""

    def __init__(self, home, url: str, **extra: str) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
        }
        env.update(
            HERON_HOME=str(home),
            TERM="xterm",
            PROMPT_TOOLKIT_NO_CPR="1",  # the emulator does not answer cursor position requests
            **_env(url),
            **extra,
        )
        self.screen = pyte.HistoryScreen(COLS, ROWS, history=10_000)
        self.stream = pyte.Stream(self.screen)
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "heron", "chat", "--conversation", "screen"],
            env=env,
            dimensions=(ROWS, COLS),
            encoding="utf-8",
            codec_errors="replace",
        )
        self.wait_for(lambda: self.prompt().endswith("›"), "the prompt")

    def read(self, timeout: float) -> None:
        """Play what the chat printed into the emulator (waiting up to `timeout` for some)."""
        try:
            self.stream.feed(self.child.read_nonblocking(65536, timeout=timeout))
        except pexpect.TIMEOUT:
            pass

    def wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not ready():
            assert time.monotonic() < deadline, f"no {what} on screen:\n" + "\n".join(self.lines())
            self.read(0.2)

    def display(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def lines(self) -> list[str]:
        """Everything a person can see or scroll back to: the scrollback, then the screen."""
        scrolled = [
            "".join(line[x].data for x in range(COLS)).rstrip() for line in self.screen.history.top
        ]
        return scrolled + self.display()

    def prompt(self) -> str:
        """The line the cursor is on: prompt_toolkit's input line."""
        return self.display()[self.screen.cursor.y].strip()

    def read_until(self, ready: Callable[[], bool], what: str) -> None:
        """Like `wait_for`, but `ready` is asked after each character is played: the screen
        at the very moment something appears, not after a chunk that also redrew it."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert time.monotonic() < deadline, f"no {what} on screen:\n" + "\n".join(self.lines())
            try:
                chunk = self.child.read_nonblocking(65536, timeout=0.2)
            except pexpect.TIMEOUT:
                continue
            for char in chunk:
                self.stream.feed(char)
                if ready():
                    return

    def shows(self, text: str) -> bool:
        return any(text in line for line in self.lines())

    def type(self, text: str) -> None:
        self.child.send(text)

    def leave(self) -> None:
        self.child.sendcontrol("d")
        self.wait_for(lambda: self.shows("Bye."), "goodbye")
        self.child.expect(pexpect.EOF, timeout=TIMEOUT)


def _count(lines: list[str], text: str) -> int:
    return sum(line.count(text) for line in lines)


def _rows(home, role: str) -> list[tuple[str, dict]]:
    """(text, meta) of the record's messages from `role`, oldest first."""
    store = Store(home / "heron.db")
    try:
        rows = store.branch(store.open_conversation("screen").id)
        return [(m.message.text, m.meta) for m in rows if m.role == role]
    finally:
        store.close()


def _said(home, role: str) -> list[str]:
    return [text for text, _ in _rows(home, role)]


@pytest.mark.parametrize("mode", ["inprocess", "serve"])
def test_a_reply_taller_than_the_terminal_appears_exactly_once(heron_home, mode):
    reply = ServerReply(text=TALL, chunk_size=24)
    with FakeOpenAIServer([reply]) as server, maybe_serve(mode, heron_home, _env(server.base_url)):
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("tell me a long story\r")
        chat.wait_for(lambda: chat.prompt() == "›", "the end of the turn")
        chat.wait_for(lambda: chat.shows("Paragraph 40"), "the last paragraph")
        seen = chat.lines()
        chat.leave()
    for n in range(1, 41):
        assert _count(seen, f"Paragraph {n:02d} of the long answer.") == 1, n
    # in order, top to bottom, one blank line between paragraphs, as the Markdown says
    start = next(i for i, line in enumerate(seen) if "Paragraph 01" in line)
    assert [line.strip() for line in seen[start : start + 79]] == TALL.split("\n")


@pytest.mark.parametrize("mode", ["inprocess", "serve"])
def test_the_prompt_turns_idle_only_once_the_last_block_is_on_screen(heron_home, mode):
    """The prompt came back (a plain "›") about 0.2 s before the reply's last block was
    printed: a Ctrl-D typed then left that block under the prompt."""
    # The reply pauses just before the piece that ends paragraph 39 (the role, then 55 pieces
    # of 24 characters): then that block, the last one and the turn's end come at once.
    resume = threading.Event()
    reply = ServerReply(text=TALL, chunk_size=24, stall_after_events=56, resume=resume)
    with FakeOpenAIServer([reply]) as server, maybe_serve(mode, heron_home, _env(server.base_url)):
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("tell me a long story\r")
        chat.wait_for(lambda: chat.shows("Paragraph 38"), "the reply streaming")
        resume.set()
        chat.read_until(lambda: chat.prompt() == "›", "the idle prompt")
        shown_when_idle = chat.shows("Paragraph 40 of the long answer.")
        chat.leave()
    assert shown_when_idle


def test_a_spinner_with_the_elapsed_time_shows_until_the_first_token(heron_home):
    first_token = threading.Event()

    def script(body: dict) -> ServerReply:
        first_token.wait(TIMEOUT)  # the model "thinks" until the test has seen the spinner
        return ServerReply(text="Here at last.")

    with FakeOpenAIServer(script) as server:
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("are you there?\r")
        frames: set[str] = set()
        thinking = re.compile(r"^(\S) thinking (\d+)s · Ctrl-C stops ›")

        def spinning() -> bool:  # two frames seen, and a second counted
            found = thinking.match(chat.prompt())
            if found:
                frames.add(found.group(1))
            return len(frames) >= 2 and found is not None and int(found.group(2)) >= 1

        chat.wait_for(spinning, "a turning spinner with the seconds waited")
        first_token.set()
        chat.wait_for(lambda: chat.shows("Here at last."), "the reply")
        chat.wait_for(lambda: chat.prompt() == "›", "the end of the turn")
        assert not any("thinking" in line for line in chat.display())  # gone with the turn
        chat.leave()
    assert frames <= set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")


def test_text_typed_during_a_turn_stays_on_the_input_line(heron_home):
    resume = threading.Event()
    first, second = "The first part streams in.", "The second part comes after the typing."
    replies = [
        # stalls after its first paragraph (role, then four 8-character pieces), until resumed
        ServerReply(text=f"{first}\n\n{second}", stall_after_events=5, resume=resume),
        ServerReply(text="Got your note."),
    ]
    with FakeOpenAIServer(replies) as server:
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("go\r")
        chat.wait_for(lambda: chat.prompt().startswith("working"), "the working prompt")
        chat.type("a half typed note")
        chat.wait_for(lambda: chat.prompt().endswith("› a half typed note"), "the typed text")
        resume.set()
        chat.wait_for(lambda: chat.prompt() == "› a half typed note", "the end of the turn")
        # the prompt can redraw before the last block's print reaches the terminal, and a
        # print erases the input line before drawing it again: wait for both at once
        chat.wait_for(
            lambda: chat.shows(second) and chat.prompt() == "› a half typed note",
            "the second paragraph above the typed text",
        )
        seen = chat.lines()
        assert _count(seen, first) == 1 and _count(seen, second) == 1
        assert _count(seen, "a half typed note") == 1  # on the input line alone
        reply_at = [i for i, line in enumerate(seen) if first in line or second in line]
        assert reply_at[1] - reply_at[0] == 2  # the two paragraphs, one blank line between
        chat.type("\r")  # the note is sent as the next message
        chat.wait_for(lambda: chat.shows("Got your note."), "the answer to the note")
        chat.leave()
    assert _said(heron_home, "user") == ["go", "a half typed note"]


@pytest.mark.parametrize("mode", ["inprocess", "serve"])
def test_ctrl_c_mid_reply_keeps_the_partial_reply_once_and_marks_it_interrupted(heron_home, mode):
    read, more = "The part the person already read.", "And a second paragraph, read too."
    # Both paragraphs stream (role + 18 pieces of 4 characters: 70), then the model stalls.
    reply = ServerReply(text=f"{read}\n\n{more}\n\n", chunk_size=4, stall_after_events=19)
    with FakeOpenAIServer([reply]) as server, maybe_serve(mode, heron_home, _env(server.base_url)):
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("explain\r")
        chat.wait_for(lambda: chat.shows(more), "the second paragraph")
        chat.child.sendcontrol("c")
        chat.wait_for(lambda: chat.shows("Stopped."), "the stop")
        chat.wait_for(lambda: chat.prompt() == "›", "the end of the turn")
        seen = chat.lines()
        chat.leave()
    assert _count(seen, read) == 1 and _count(seen, more) == 1
    top = next(i for i, line in enumerate(seen) if read in line)
    shown = [line.strip() for line in seen[top:] if line.strip()]
    # the reply as it streamed, then what the stop says: no prompt left between its lines
    assert shown[:3] == [read, more, "Stopped. What the turn finished is kept."]
    [(text, meta)] = _rows(heron_home, "assistant")
    assert text.startswith(f"{read}\n\n{more}") and text.endswith(REPLY_STOPPED)
    assert meta.get("interrupted") is True


def test_ctrl_c_as_a_signal_stops_the_turn_and_keeps_the_chat(heron_home):
    """Ctrl-C as SIGINT (what the terminal sends for the key in its line mode, whenever the
    prompt is down: between prompts, while a reply is printed above it) stops the turn as the
    key does, and the chat goes on. It used to give a fresh prompt with the turn still running
    (prompt_toolkit's own SIGINT binding), or, with no prompt up, reach asyncio's handler."""
    reply = ServerReply(text="A first paragraph.\n\n", chunk_size=4, stall_after_events=6)
    with FakeOpenAIServer([reply, ServerReply(text="still here")]) as server:
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("explain\r")
        chat.wait_for(lambda: chat.shows("A first paragraph."), "the paragraph")
        chat.child.kill(signal.SIGINT)  # as the terminal does with the key in its line mode
        chat.wait_for(lambda: chat.shows("Stopped."), "the stop")
        chat.wait_for(lambda: chat.prompt() == "›", "the end of the turn")
        chat.type("again\r")
        chat.wait_for(lambda: chat.shows("still here"), "the next answer")
        chat.leave()
    [first, _] = _rows(heron_home, "assistant")
    assert first[1].get("interrupted") is True


@pytest.mark.parametrize("mode", ["inprocess", "serve"])
def test_ctrl_c_right_after_enter_stops_the_turn_before_it_has_started(heron_home, mode):
    """Ctrl-C after Enter but before the turn has said it started (a serve says so once the
    message is stored: about a second for its first turn) was taken for "nothing runs": a
    fresh prompt line, and the turn ran to its end. The serve is held (SIGSTOP) across the
    key, so the key always lands there. The reply stalls after its first words: only a stop
    ends this turn."""
    reply = ServerReply(text="Words that wait for a stop.", chunk_size=4, stall_after_events=3)
    with (
        FakeOpenAIServer([reply]) as server,
        maybe_serve(mode, heron_home, _env(server.base_url)) as serve,
    ):
        chat = ChatScreen(heron_home, server.base_url)
        pid = serve.proc.pid if serve is not None else None
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)  # the turn cannot start until the key is in
        try:
            chat.type("explain\r")
            chat.wait_for(
                lambda: chat.shows("› explain") and not chat.prompt().endswith("explain"),
                "the message sent",
            )
            chat.child.sendcontrol("c")
            chat.type("x")  # keys are read in order: the x on the prompt says Ctrl-C was taken
            chat.wait_for(lambda: chat.prompt().endswith("› x"), "the key after Ctrl-C")
            chat.type("\x7f")
        finally:
            if pid is not None:
                os.kill(pid, signal.SIGCONT)
        _stopped_with_the_message_kept(chat, heron_home)


def _stopped_with_the_message_kept(chat: ChatScreen, heron_home) -> None:
    """The turn stopped, the chat back at its prompt, and the message "explain" kept with an
    interrupted answer (a stop that overtook the message's commit lost it)."""
    chat.wait_for(lambda: chat.shows("Stopped."), "the stop")
    chat.wait_for(lambda: chat.prompt() == "›", "the end of the turn")
    chat.leave()
    assert _said(heron_home, "user") == ["explain"]
    [(_, meta)] = _rows(heron_home, "assistant")
    assert meta.get("interrupted") is True


def test_ctrl_c_typed_with_the_enter_stops_the_in_process_turn(heron_home):
    """QA: in-process, Ctrl-C half a second after the first Enter gave a fresh line and the
    turn streamed to its end. A busy moment after Enter leaves the key unread until the next
    prompt, which read it before the loop had taken the message: "nothing runs". Sent in one
    write with the Enter, the key always lands in that gap."""
    reply = ServerReply(text="Words that wait for a stop.", chunk_size=4, stall_after_events=3)
    with FakeOpenAIServer([reply]) as server:
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("explain\r\x03")
        _stopped_with_the_message_kept(chat, heron_home)


def test_the_terminal_does_not_echo_ctrl_c_while_the_chat_runs_and_is_restored_after(heron_home):
    """In line mode the terminal would echo the key as "^C" into the reply, before "Stopped."
    (it did, in the test above, when the key came while a block was printed): the chat turns
    that echo off while it runs and puts the terminal back as it found it."""
    import termios

    with FakeOpenAIServer([]) as server:
        chat = ChatScreen(heron_home, server.base_url)
        tty = chat.child.child_fd  # the pseudo-terminal's modes, read from its other side
        assert termios.tcgetattr(tty)[3] & termios.ECHOCTL == 0
        chat.leave()
    assert termios.tcgetattr(tty)[3] & termios.ECHOCTL


def test_a_mistyped_command_asks_did_you_mean_and_reaches_no_model(heron_home):
    with FakeOpenAIServer([]) as server:
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("/stauts\r")
        chat.wait_for(lambda: chat.shows("did you mean /status?"), "the suggestion")
        assert chat.shows("unknown command /stauts; did you mean /status?")
        chat.leave()
        assert server.requests == []


@pytest.mark.parametrize("mode", ["inprocess", "serve"])
def test_show_prints_the_call_and_its_whole_result_the_model_read_cut(heron_home, mode):
    call = ServerReply(tool_calls=[("bash", {"command": "seq 1 5000"})])
    replies = [call, ServerReply(text="Counted.")]
    with FakeOpenAIServer(replies) as server, maybe_serve(mode, heron_home, _env(server.base_url)):
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("/show 1\r")
        chat.wait_for(
            lambda: chat.shows("No tool calls shown in this chat yet"), "the plain refusal"
        )
        chat.type("count to 5000\r")
        chat.wait_for(lambda: chat.shows("Counted."), "the reply")
        assert chat.shows('⚙ 1 bash {"command": "seq 1 5000"} ✓')  # the pill, args and all
        chat.type("/show 1\r")
        chat.wait_for(lambda: chat.shows("[exit code 0]"), "the whole result")
        shown = chat.lines()
        chat.leave()
        # The request that carried the tool's result (the chat's close may ask memory's review
        # pass after it).
        sent = next(
            r["messages"][-1]["content"]
            for r in reversed(server.requests)
            if r["messages"][-1]["role"] == "tool"
        )
    assert "characters omitted" in sent  # the model read head and tail
    start = shown.index('bash {"command": "seq 1 5000"}')
    assert shown[start + 1 : start + 5001] == [str(n) for n in range(1, 5001)]


def test_the_resume_list_refuses_what_is_not_on_it_and_exit_there_leaves(heron_home):
    with FakeOpenAIServer([ServerReply(text="Hello there.")]) as server:
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("hello\r")
        chat.wait_for(lambda: chat.shows("Hello there."), "the reply")
        chat.type("/resume\r")
        chat.wait_for(lambda: chat.shows("Enter closes the list"), "the list")
        chat.type("abc\r")
        chat.wait_for(lambda: chat.shows("abc is not on the list"), "the refusal")
        # asked again (the prompt is drawn after the refusal is printed: wait for it)
        chat.wait_for(lambda: chat.prompt().startswith("Number to resume"), "the list's prompt")
        chat.type("/exit\r")
        chat.wait_for(lambda: chat.shows("Bye."), "goodbye")
        chat.child.expect(pexpect.EOF, timeout=TIMEOUT)


ESC = "\x1b"


@pytest.mark.parametrize("mode", ["inprocess", "serve"])
def test_escape_codes_the_model_wrote_are_shown_and_never_obeyed(heron_home, mode):
    """qa21p finding 1: the command's codes erased its own line and the question above it, so
    the screen asked `ls -la`, run it?; a reply's codes set the title and cleared the screen."""
    command = f"touch APPROVED_EVIL # {ESC}[2K{ESC}[1G{ESC}[1A{ESC}[2K  ls -la"
    reply = f"Declined, {ESC}]0;OWNED{ESC}\\ {ESC}[2J{ESC}[H fine."
    replies = [ServerReply(tool_calls=[("bash", {"command": command})]), ServerReply(text=reply)]
    unconfined = {"HERON_BWRAP": "off"}  # the approval prompt is then the only guard
    env = {**_env(""), **unconfined}
    with FakeOpenAIServer(replies) as server:
        env["HERON_BASE_URL"] = server.base_url
        with maybe_serve(mode, heron_home, env):
            chat = ChatScreen(heron_home, server.base_url, **unconfined)
            chat.type("go\r")
            chat.wait_for(
                lambda: chat.shows("↑ the whole command") and chat.prompt().startswith("run it?"),
                "the approval prompt",
            )
            asked = chat.display()
            chat.type("n\r")
            chat.wait_for(lambda: chat.shows("fine."), "the reply")
            seen, title = chat.lines(), chat.screen.title
            chat.leave()
    start = asked.index("The agent wants to run (bash, unconfined):")
    assert asked[start + 1] == "touch APPROVED_EVIL # \\x1b[2K\\x1b[1G\\x1b[1A\\x1b[2K  ls -la"
    assert asked[start + 2].startswith("↑ the whole command (bash, unconfined): 1 line, ")
    assert asked[start + 3].startswith("run it? [y/N]")
    assert title == ""  # the reply's OSC 0 was shown, not obeyed
    assert any("\\x1b]0;OWNED\\x1b\\ \\x1b[2J\\x1b[H fine." in line for line in seen)
    assert any("The agent wants to run" in line for line in seen)  # no clear screen
    assert not (heron_home / "workspace" / "APPROVED_EVIL").exists()
