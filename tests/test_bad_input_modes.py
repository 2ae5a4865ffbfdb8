"""The same bad input through the real `heron run`, in-process and through a running `heron
serve`: the same message (the home's path aside), the same exit code, and nothing lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import ServeProcess, clean_env
from test_e2e_cli import heron, openai_env

from heron.messages import MESSAGE_LIMIT
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # the real CLI and a real serve in subprocesses


def _homes(tmp_path: Path) -> dict[str, Path]:
    homes = {"inprocess": tmp_path / "alone", "serve": tmp_path / "served"}
    for home in homes.values():
        home.mkdir()
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


def test_an_unknown_model_fails_the_turn_alike_and_keeps_the_message(tmp_path):
    homes, told = _homes(tmp_path), {}
    refusal = ServerReply(
        status=404,
        error_body={
            "error": {
                "message": "The model `no-such-model` does not exist",
                "type": "invalid_request_error",
                "code": "model_not_found",
            }
        },
    )
    with FakeOpenAIServer([refusal] * 2) as server:
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
    assert told["serve"] == told["inprocess"] == (0, "", "Nothing to retry yet.\n")
    assert asked == 0
    for home in homes.values():
        assert _texts(home, "no-such-key") == []


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
