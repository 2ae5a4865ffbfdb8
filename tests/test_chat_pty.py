"""The real `heron chat` in a pseudo-terminal, against a fake model server on loopback: what a
person types while the agent works reaches the running turn, and survives /stop."""

from __future__ import annotations

import json
import os
import signal
import sys
import termios

import pexpect
import pytest
from serve_helpers import maybe_serve

from heron.agent.control import MAIL_LABEL
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow

# The tool call waits in the workspace until the test lets it go (or forever), so what the
# test types is typed while the agent works, whatever the machine's speed.
WAIT = "while [ ! -e go ]; do sleep 0.05; done; echo released"
TIMEOUT = 120  # generous: a busy two-core machine starts Python slowly


def _env(url: str) -> dict[str, str]:
    return {"HERON_BASE_URL": url, "HERON_API_KEY": "dummy", "HERON_MODEL": "fake-model"}


def _spawn(home, url: str, **extra: str) -> pexpect.spawn:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
    }
    env.update(
        HERON_HOME=str(home),
        HERON_BASE_URL=url,
        HERON_API_KEY="dummy",
        HERON_MODEL="fake-model",
        TERM="xterm",
        PROMPT_TOOLKIT_NO_CPR="1",  # pexpect does not answer cursor position requests
        **extra,
    )
    child = pexpect.spawn(
        sys.executable,
        ["-m", "heron", "chat", "--conversation", "pty"],
        env=env,
        dimensions=(40, 160),
        encoding="utf-8",
        timeout=TIMEOUT,
    )
    child.expect("›")  # the prompt is up
    return child


def _leave(child: pexpect.spawn) -> None:
    child.sendcontrol("d")
    child.expect("Bye.")
    child.expect(pexpect.EOF)


def _last_user_text(body: dict) -> str:
    last = body["messages"][-1]
    content = last.get("content")
    return content if isinstance(content, str) else json.dumps(content)


def _user_rows(home) -> list[tuple[int | None, str]]:
    store = Store(home / "heron.db")
    try:
        conversation = store.open_conversation("pty")
        rows = store.branch(conversation.id)
        said = [m for m in rows if m.role == "user" and m.message.text]  # not bare tool results
        return [(m.turn_id, m.message.text) for m in said]
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["inprocess", "serve"])  # chat in-process or through a serve
def test_a_message_typed_while_the_agent_works_is_answered_in_the_same_turn(heron_home, mode):
    def script(body: dict) -> ServerReply:
        if MAIL_LABEL.strip() in _last_user_text(body):  # after the tool's result, same turn
            return ServerReply(text="Both done: the job, and it is blue.")
        return ServerReply(text="Starting.", tool_calls=[("bash", {"command": WAIT})])

    with FakeOpenAIServer(script) as server, maybe_serve(mode, heron_home, _env(server.base_url)):
        child = _spawn(heron_home, server.base_url)
        assert ("through heron serve" in child.before) == (mode == "serve")
        child.sendline("start the job")
        child.expect("Starting.")
        child.sendline("also make it blue")
        child.expect("added to the running turn")
        (heron_home / "workspace" / "go").touch()
        child.expect("Both done: the job, and it is blue.")
        _leave(child)
        requests = server.requests
    assert len(requests) == 2  # one turn: the follow-up rode along with the tool's result
    users = _user_rows(heron_home)
    assert [text for _, text in users] == ["start the job", MAIL_LABEL + "also make it blue"]
    assert users[0][0] == users[1][0]  # the same turn


@pytest.mark.parametrize("mode", ["inprocess", "serve"])
def test_the_answer_to_a_question_is_acknowledged_as_the_answer(heron_home, mode):
    """The line typed after the agent's question (ask_user) answers it, and the chat says so
    ("↳ added to the running turn" said it went to the mailbox)."""

    def script(body: dict) -> ServerReply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return ServerReply(text="Booked: " + str(last["content"]))
        return ServerReply(tool_calls=[("ask_user", {"question": "Which city?"})])

    with FakeOpenAIServer(script) as server, maybe_serve(mode, heron_home, _env(server.base_url)):
        child = _spawn(heron_home, server.base_url)
        child.sendline("book a trip")
        child.expect("Waiting up to 60 minutes for your answer")
        child.expect("your next message answers it")
        child.sendline("Lisbon")
        child.expect("↳ (answered the agent's question|added to the running turn)")
        acknowledged = child.match.group(1)
        child.expect("Booked: The user answered: Lisbon")
        _leave(child)
    assert acknowledged == "answered the agent's question"


def test_exit_after_a_refused_key_does_not_start_the_memory_review_with_it(heron_home):
    """A chat whose model refused the key left with "Reviewing this chat for memory in the
    background with openai/fake-model": model calls with the same key, failing unseen."""
    refused = {"error": {"message": "Incorrect API key", "code": "invalid_api_key"}}
    with FakeOpenAIServer([ServerReply(status=401, error_body=refused)]) as server:
        child = _spawn(heron_home, server.base_url)
        child.sendline("hello")
        child.expect("The turn failed")
        child.sendline("/exit")
        child.expect("Bye.")
        child.expect(pexpect.EOF)
        after = child.before
    assert "Not reviewing this chat for memory: the model's last call failed (HTTP 401" in after
    assert "Reviewing this chat" not in after


def test_a_follow_up_typed_before_stop_is_kept_and_answered_next(heron_home):
    def script(body: dict) -> ServerReply:
        if "the second thing" in _last_user_text(body):
            return ServerReply(text="Answered the second thing.")
        return ServerReply(text="Starting.", tool_calls=[("bash", {"command": WAIT})])

    with FakeOpenAIServer(script) as server:
        child = _spawn(heron_home, server.base_url)
        child.sendline("start the job")
        child.expect("Starting.")
        child.sendline("and the second thing")
        child.expect("added to the running turn")
        child.sendline("/stop")
        child.expect("Stopped")
        child.expect("Answered the second thing.")
        _leave(child)
    users = _user_rows(heron_home)
    assert [text for _, text in users] == ["start the job", "and the second thing"]
    assert users[0][0] != users[1][0]  # kept, and answered in a turn of its own


@pytest.mark.parametrize("mode", ["inprocess", "serve"])  # the serve asks its clients
def test_an_unconfined_command_waits_for_the_person_typing_y(heron_home, mode):
    def script(body: dict) -> ServerReply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return ServerReply(text="The command said: " + str(last["content"]).split("\n")[0])
        return ServerReply(tool_calls=[("bash", {"command": "echo approved-and-ran"})])

    # As on a machine where bubblewrap cannot run: approval is "ask".
    unconfined = {"HERON_BWRAP": "off"}
    with (
        FakeOpenAIServer(script) as server,
        maybe_serve(mode, heron_home, {**_env(server.base_url), **unconfined}),
    ):
        child = _spawn(heron_home, server.base_url, **unconfined)
        assert ("through heron serve" in child.before) == (mode == "serve")
        child.sendline("run the echo")
        child.expect("The agent wants to run")
        child.expect("echo approved-and-ran")
        child.sendline("y")
        child.expect("The command said: approved-and-ran")
        _leave(child)


def test_a_chat_through_serve_is_told_when_the_serve_stops_and_exits_1(heron_home):
    reply = [ServerReply(text="Hello from the serve.")]
    with (
        FakeOpenAIServer(reply) as server,
        maybe_serve("serve", heron_home, _env(server.base_url)) as serve,
    ):
        child = _spawn(heron_home, server.base_url)
        child.sendline("hi")
        child.expect("Hello from the serve.")
        serve.proc.send_signal(signal.SIGTERM)  # the chat waits at its prompt
        assert serve.proc.wait(60) == 0
        child.expect("heron serve stopped")
        child.expect(pexpect.EOF)
        child.close()
    assert child.exitstatus == 1


def _session_left(session: int) -> list[str]:
    """The processes still in `session` (the chat was its leader): what it left behind."""
    left = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rpartition(")")[2].split()  # after the command's name, which may hold spaces
        if int(fields[3]) == session and fields[0] != "Z":
            left.append(stat)
    return left


def _turns(home) -> tuple[list[tuple[str, str]], list[str]]:
    store = Store(home / "heron.db")
    try:
        conversation = store.open_conversation("pty")
        rows = [
            (m.role, m.message.text or "".join(r.content for r in m.message.tool_results))
            for m in store.branch(conversation.id)
        ]
        return rows, [t.status for t in store.turns(conversation.id)]
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["inprocess", "serve"])
@pytest.mark.parametrize("how", ["SIGTERM", "closed"])  # `kill`, or the terminal window closed
def test_a_signal_stops_the_turn_as_stop_does_and_the_chat_exits(heron_home, mode, how):
    """SIGTERM, or SIGHUP from the terminal closing: the running turn is stopped as /stop
    stops it (the finished tool call and what streamed kept, the turn interrupted), the
    terminal is put back, and the chat exits 128 + the signal's number, leaving nothing."""
    from heron.agent.turn import REPLY_STOPPED

    replies = [
        ServerReply(text="Looking.", tool_calls=[("bash", {"command": "echo first-done"})]),
        # Streams its first block, then nothing more until the chat goes away.
        ServerReply(text="First block.\n\nand the rest", chunk_size=14, stall_after_events=2),
    ]
    with FakeOpenAIServer(replies) as server, maybe_serve(mode, heron_home, _env(server.base_url)):
        child = _spawn(heron_home, server.base_url)
        child.sendline("look it up")
        child.expect("First block.")
        if how == "SIGTERM":
            child.kill(signal.SIGTERM)
            child.expect("Ended by SIGTERM.")
            child.expect(pexpect.EOF)
            attrs = termios.tcgetattr(child.child_fd)  # the pty's, as the chat left it
            child.close()
            status, code = child.exitstatus, 128 + signal.SIGTERM
        else:  # the kernel sends SIGHUP to the chat, whose terminal this was
            os.close(child.child_fd)
            _, status = os.waitpid(child.pid, 0)
            status, code, attrs = os.waitstatus_to_exitcode(status), 128 + signal.SIGHUP, None
            child.closed, child.terminated = True, True  # reaped here: pexpect has nothing to do
        rows, turns = _turns(heron_home)
        left = _session_left(child.pid)
    assert status == code
    assert turns == ["interrupted"]
    assert rows[0] == ("user", "look it up")
    assert rows[1][0] == "assistant" and rows[1][1] == "Looking."
    assert rows[2][0] == "user" and "first-done" in rows[2][1]  # the finished call's result
    assert rows[3] == ("assistant", f"First block.\n\n{REPLY_STOPPED}")
    assert left == []
    if attrs is not None:  # line mode, echo, Ctrl-D's end of input: as the chat found them
        lflag, cc = attrs[3], attrs[6]
        assert lflag & termios.ICANON and lflag & termios.ECHO and lflag & termios.ECHOCTL
        assert cc[termios.VEOF] == b"\x04"
