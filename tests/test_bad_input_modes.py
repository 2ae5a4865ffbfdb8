"""The same bad input through the real `heron run` and the real `heron chat`, in-process and
through a running `heron serve`: the same message (the home's path aside), the same exit code
or the same screen, and nothing lost."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_helpers import ServeProcess, clean_env, maybe_serve
from test_chat_screen import ChatScreen
from test_e2e_cli import heron, openai_env

from heron.messages import MESSAGE_LIMIT
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # the real CLI and a real serve in subprocesses


def _homes(tmp_path: Path) -> dict[str, Path]:
    homes = {"inprocess": tmp_path / "alone", "serve": tmp_path / "served"}
    for home in homes.values():
        home.mkdir(mode=0o700)  # as Heron makes a home: a readable one is made so, and said
    return homes


def _said(result: subprocess.CompletedProcess[str], home: Path) -> tuple[int, str]:
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stderr.replace(str(home), "HOME")


def _texts(home: Path, key: str) -> list[tuple[str, str]]:
    store = Store(home / "heron.db")
    try:
        conversation = store.conversation(key)
        if conversation is None:
            return []
        return [(r.role, r.message.text) for r in store.branch(conversation.id)]
    finally:
        store.close()


def test_a_config_broken_while_a_serve_runs_is_refused_as_in_process(tmp_path):
    homes, told = _homes(tmp_path), {}
    with FakeOpenAIServer([ServerReply(text="first answer")] * 2) as server:
        env = openai_env(server.base_url)
        with ServeProcess(homes["serve"], env):
            for mode, home in homes.items():
                assert heron(home, env, "run", "-c", "k", "first").returncode == 0
                (home / "config.toml").write_text("[agent\nname = 1\n")
                told[mode] = _said(heron(home, env, "run", "-c", "k", "second"), home)
        asked = len(server.requests)
    assert told["serve"] == told["inprocess"]
    code, stderr = told["serve"]
    assert code == 2 and stderr.startswith("heron: HOME/config.toml:1: malformed TOML")
    assert stderr.rstrip().endswith("Fix that line, or move the file aside.")
    assert asked == 2  # the refused message reached no model
    for home in homes.values():  # kept: the first exchange; the refused message: not stored
        assert _texts(home, "k") == [("user", "first"), ("assistant", "first answer")]


def test_a_missing_api_key_is_the_same_refusal_from_run_and_from_serve(tmp_path):
    homes = _homes(tmp_path)
    env = {"HERON_MODEL": "gpt-4o"}  # an OpenAI model, and no key anywhere
    alone = _said(heron(homes["inprocess"], env, "run", "hi"), homes["inprocess"])
    serve = subprocess.run(
        [sys.executable, "-m", "heron", "serve", "--port", "0"],
        env=clean_env(homes["serve"], env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert _said(serve, homes["serve"]) == alone
    assert alone[0] == 2 and alone[1].startswith("heron: no OpenAI API key\nSet OPENAI_API_KEY")
    assert not (homes["serve"] / "serve.json").exists()


# What an OpenAI-compatible server answers for a model it does not have.
NO_SUCH_MODEL = ServerReply(
    status=404,
    error_body={
        "error": {
            "message": "The model `no-such-model` does not exist",
            "type": "invalid_request_error",
            "code": "model_not_found",
        }
    },
)


def test_an_unknown_model_fails_the_turn_alike_and_keeps_the_message(tmp_path):
    homes, told = _homes(tmp_path), {}
    with FakeOpenAIServer([NO_SUCH_MODEL] * 2) as server:
        env = {**openai_env(server.base_url), "HERON_MODEL": "no-such-model"}
        with ServeProcess(homes["serve"], env):
            for mode, home in homes.items():
                told[mode] = _said(heron(home, env, "run", "-c", "k", "hello"), home)
    assert told["serve"] == told["inprocess"]
    code, stderr = told["serve"]
    assert code == 1 and "no-such-model" in stderr and "heron run --retry -c k" in stderr
    for home in homes.values():
        assert _texts(home, "k")[:1] == [("user", "hello")]


def test_an_unknown_conversation_key_answers_alike(tmp_path):
    homes, told = _homes(tmp_path), {}
    with FakeOpenAIServer([]) as server:
        env = openai_env(server.base_url)
        with ServeProcess(homes["serve"], env):
            for mode, home in homes.items():
                result = heron(home, env, "run", "--retry", "-c", "no-such-key")
                told[mode] = (*_said(result, home), result.stdout)
        asked = len(server.requests)
    refused = "heron: no conversation 'no-such-key'\nSee: heron conversations list\n"
    assert told["serve"] == told["inprocess"] == (2, refused, "")
    assert asked == 0
    for home in homes.values():  # not even an empty conversation: nothing lists it
        store = Store(home / "heron.db")
        assert store.conversation("no-such-key") is None
        store.close()


def test_an_oversized_message_is_refused_alike_before_anything_is_stored(tmp_path):
    homes, told = _homes(tmp_path), {}
    huge = "x" * (MESSAGE_LIMIT + 1)
    with FakeOpenAIServer([]) as server:
        env = openai_env(server.base_url)
        with ServeProcess(homes["serve"], env):
            for mode, home in homes.items():
                told[mode] = _said(heron(home, env, "run", "-c", "k", "-", stdin=huge), home)
                told[mode + " argument"] = _said(
                    heron(home, env, "run", "-c", "k", "look", stdin=huge), home
                )
        asked = len(server.requests)
    assert len(set(told.values())) == 1
    code, stderr = told["serve"]
    assert code == 2
    assert stderr == (
        "heron: the message is 8.0 MB; one message holds at most 8 MB. "
        "Save it as a file in the workspace and ask about the file\n"
    )
    assert asked == 0
    for home in homes.values():
        assert _texts(home, "k") == []


MODES = ("inprocess", "serve")
BROKEN = "[agent\nname = 1\n"
# An in-process chat starts a detached memory review as it closes (a serve's client leaves
# that to the serve): off, so both modes do the same and nothing outlives the test.
QUIET = "[memory]\nreview_on_close = false\n"


@contextlib.contextmanager
def _short_home() -> Iterator[Path]:
    """A home whose path is as long in either mode (/tmp/heron-XXXXXXXX), so a chat line that
    names it wraps at the same column both ways."""
    with tempfile.TemporaryDirectory(prefix="heron-") as tmp:
        (Path(tmp) / "config.toml").write_text(QUIET)
        yield Path(tmp)


def _screen(chat: ChatScreen, home: Path, first: str) -> list[str]:
    """The chat's lines from the one where `first` was typed on (the header above it names
    the mode), with the home's path as HOME."""
    lines = chat.lines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"› {first}"))
    return [line.replace(str(home), "HOME") for line in lines[start:] if line.strip()]


def _answered(chat: ChatScreen, typed: str, answer: str) -> bool:
    """`answer` shows below the line where `typed` was sent."""
    lines = chat.lines()
    sent = [i for i, line in enumerate(lines) if line.startswith(f"› {typed}")]
    return bool(sent) and any(answer in line for line in lines[sent[-1] + 1 :])


def test_chat_will_not_open_on_a_config_broken_while_a_serve_runs_as_without_one(tmp_path):
    homes, told = _homes(tmp_path), {}
    with FakeOpenAIServer([]) as server:
        env = openai_env(server.base_url)
        with ServeProcess(homes["serve"], env):
            for mode, home in homes.items():
                (home / "config.toml").write_text(BROKEN)
                told[mode] = _said(heron(home, env, "chat"), home)
        asked = len(server.requests)
    assert told["serve"] == told["inprocess"]
    code, stderr = told["serve"]
    assert code == 2 and stderr.startswith("heron: HOME/config.toml:1: malformed TOML")
    assert asked == 0


def _kept(home: Path) -> list[tuple[str, str]]:
    return _texts(home, "screen")  # the conversation ChatScreen opens


def _mid_chat_config(mode: str) -> tuple[list[str], int, list[tuple[str, str]]]:
    """A chat that breaks config.toml after its first turn, sends a message and /new, fixes
    the file and sends again: what it showed, how many requests the model got, what it kept."""
    replies = [ServerReply(text="first answer"), ServerReply(text="third answer")]
    with _short_home() as home, FakeOpenAIServer(replies) as server:
        with maybe_serve(mode, home, openai_env(server.base_url)):
            chat = ChatScreen(home, server.base_url)
            chat.type("first\r")
            chat.wait_for(lambda: chat.shows("first answer"), "the first answer")
            # typed before the prompt turns idle, the line would read "working 1s · ... › second"
            chat.wait_for(lambda: chat.prompt() == "›", "the end of the first turn")
            (home / "config.toml").write_text(BROKEN)
            chat.type("second\r")
            chat.wait_for(lambda: chat.shows("Fix that line"), "the refusal")
            chat.type("/new\r")  # a command the AgentLoop answers: refused too
            chat.wait_for(lambda: _answered(chat, "/new", "Fix that line"), "the refusal")
            (home / "config.toml").write_text(QUIET)
            chat.type("third\r")
            chat.wait_for(lambda: chat.shows("third answer"), "the third answer")
            chat.wait_for(lambda: chat.prompt() == "›", "the end of the turn")
            shown = _screen(chat, home, "first")
            chat.leave()
        return shown, len(server.requests), _kept(home)


def test_chat_refuses_alike_while_config_is_broken_mid_chat_and_goes_on_once_fixed():
    """A serve keeps the config it started with and an in-process chat the one it opened
    with; either way a file broken meanwhile refuses what would start a turn, says why (as
    `heron run` does), stores nothing, and the chat goes on once the file loads again."""
    told = {mode: _mid_chat_config(mode) for mode in MODES}
    assert told["serve"] == told["inprocess"]
    shown, asked, kept = told["serve"]
    refusal = [
        "HOME/config.toml:1: malformed TOML: Expected ']' at the end of a",  # 80 columns
        "table declaration (at line 1, column 7)",
        "Fix that line, or move the file aside.",
    ]
    assert shown == [
        "› first",
        "first answer",
        "› second",
        *refusal,
        "› /new",
        *refusal,
        "› third",
        "third answer",
        "›",
    ]
    assert asked == 2  # the refused ones reached no model
    assert kept == [
        ("user", "first"),
        ("assistant", "first answer"),
        ("user", "third"),
        ("assistant", "third answer"),
    ]


def _failures(mode: str) -> tuple[list[str], list[tuple[str, str]]]:
    """A chat whose model refuses every request, then a retry and two bad commands."""
    said = [
        ("hello", "send /retry to answer it again"),
        ("/retry", "send /retry to answer it again"),
        ("/resume no-such-key", "No conversation"),
        ("/stauts", "did you mean"),
    ]
    with _short_home() as home, FakeOpenAIServer([NO_SUCH_MODEL] * 2) as server:
        with maybe_serve(mode, home, openai_env(server.base_url)):
            chat = ChatScreen(home, server.base_url)
            for typed, answer in said:
                chat.type(typed + "\r")
                chat.wait_for(lambda t=typed, a=answer: _answered(chat, t, a), answer)
                chat.wait_for(lambda: chat.prompt() == "›", "the prompt")
            # the error names the server, whose port is each run's own (linux's ephemeral
            # ports have five digits, so the lines wrap alike)
            shown = [
                re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", line)
                for line in _screen(chat, home, "hello")
            ]
            chat.leave()
        return shown, _kept(home)


def test_chat_shows_a_failed_turn_and_bad_commands_alike():
    told = {mode: _failures(mode) for mode in MODES}
    assert told["serve"] == told["inprocess"]
    shown, kept = told["serve"]
    failed = [
        "The turn failed: HTTP 404 from http://127.0.0.1:PORT/v1 (HERON_BASE_URL): The",
        "model `no-such-model` does not exist",
        "Run `heron models` to list the models this server offers, then pick one with",
        "`--model` (or HERON_MODEL, or model in config.toml).",
        "Your message is saved; send /retry to answer it again (it is not stored twice).",
    ]
    assert shown == [
        "› hello",
        *failed,
        "› /retry",
        *failed,
        "› /resume no-such-key",
        "No conversation 'no-such-key'. /resume lists them.",
        "› /stauts",
        "unknown command /stauts; did you mean /status?",
        "›",
    ]
    assert kept == [("user", "hello")]  # kept, and once
