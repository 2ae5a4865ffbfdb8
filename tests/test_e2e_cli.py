"""End to end: the real `heron` command in a subprocess, against fake model servers on loopback
that speak the real wire protocols."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from serve_helpers import maybe_serve

from heron.store import Store
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # the real CLI in subprocesses


def heron(home, env_extra, *args, stdin=None, timeout=120):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
    }
    env.update({"HERON_HOME": str(home), **env_extra})
    return subprocess.run(
        [sys.executable, "-m", "heron", *args],
        env=env,
        input="" if stdin is None else stdin,  # never the test runner's own stdin
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def openai_env(url):
    return {"HERON_BASE_URL": url, "HERON_API_KEY": "dummy", "HERON_MODEL": "fake-model"}


TWO_TURNS = [
    ServerReply(text="Setting it.", tool_calls=[("run_cell", {"code": "x = 6 * 7\nx"})]),
    ServerReply(text="x is set to 42."),
    ServerReply(text="x was 42."),
]


# The CLI behaves the same whether the loop runs in the `heron run` process or in a `heron serve`
# that holds the home (heron run is then a thin client of its control socket).
MODES = pytest.mark.parametrize("mode", ["inprocess", "serve"])


@MODES
def test_two_runs_on_one_key_openai(heron_home, mode):
    with (
        FakeOpenAIServer(TWO_TURNS) as server,
        maybe_serve(mode, heron_home, env := openai_env(server.base_url)),
    ):
        first = heron(heron_home, env, "run", "--conversation", "t1", "set x to 6*7 in python")
        second = heron(heron_home, env, "run", "--conversation", "t1", "what was x?")
        requests = server.requests
    assert first.returncode == 0, first.stderr
    assert "x is set to 42." in first.stdout
    assert "[run_cell ok" in first.stderr
    assert second.returncode == 0 and "x was 42." in second.stdout
    # The tool ran in a real kernel: its result (the last value, 42) went back to the model.
    tool_msgs = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert "42" in tool_msgs[0]["content"]
    # The second run's request carries the whole first exchange.
    roles = [m["role"] for m in requests[2]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert requests[2]["messages"][2]["tool_calls"][0]["function"]["name"] == "run_cell"
    shown = heron(heron_home, {}, "conversations", "show", "t1")
    assert shown.returncode == 0
    assert shown.stdout.count("── turn") == 2
    assert "→ run_cell" in shown.stdout and "x was 42." in shown.stdout


def test_two_runs_on_one_key_anthropic(heron_home):
    with FakeAnthropicServer(TWO_TURNS) as server:
        env = {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.base_url}
        args = ("run", "--model", "claude-test", "--conversation", "t1")
        first = heron(heron_home, env, *args, "set x to 6*7 in python")
        second = heron(heron_home, env, *args, "what was x?")
        requests = server.requests
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0 and "x was 42." in second.stdout
    msgs = requests[2]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    kinds = [b["type"] for b in msgs[1]["content"]]
    assert "tool_use" in kinds
    assert msgs[2]["content"][0]["type"] == "tool_result"
    shown = heron(heron_home, {}, "conversations", "show", "t1")
    assert shown.stdout.count("── turn") == 2 and "→ run_cell" in shown.stdout


@MODES
def test_stdin_message_and_failure_exit_code(heron_home, mode):
    with (
        FakeOpenAIServer([ServerReply(text="got it")]) as server,
        maybe_serve(mode, heron_home, env := openai_env(server.base_url)),
    ):
        ok = heron(heron_home, env, "run", "-", stdin="from stdin\n")
        assert ok.returncode == 0 and "got it" in ok.stdout
        assert server.requests[0]["messages"][-1]["content"].startswith("from stdin")
    refusing = [ServerReply(status=401, error_body={"error": {"message": "bad key"}})]
    with (
        FakeOpenAIServer(refusing) as server,
        maybe_serve(mode, heron_home, env := openai_env(server.base_url)),
    ):
        bad = heron(heron_home, env, "run", "hello")
    assert bad.returncode == 1
    assert "HERON_API_KEY" in bad.stderr and "saved" in bad.stderr


@MODES
def test_stdin_joins_the_argument_and_json_is_one_object(heron_home, mode):
    with (
        FakeOpenAIServer([ServerReply(text="short.")]) as server,
        maybe_serve(mode, heron_home, env := openai_env(server.base_url)),
    ):
        done = heron(heron_home, env, "run", "--json", "summarise", stdin="ctx line\n")
    assert done.returncode == 0, done.stderr
    sent = server.requests[0]["messages"][-1]["content"]
    assert sent.startswith("summarise\n\n```\nctx line\n```")
    got = json.loads(done.stdout)
    assert got["reply"] == "short." and got["ok"] is True and got["run_id"]


def test_no_model_configured_explains_and_exits_2(heron_home, monkeypatch):
    env = {"HERON_NO_EMBEDDED": "1"}  # no offline fallback either
    result = heron(heron_home, env, "run", "hi")
    assert result.returncode == 2
    assert "ANTHROPIC_API_KEY" in result.stderr and "HERON_BASE_URL" in result.stderr


def test_malformed_config_names_file_and_line(heron_home):
    (heron_home / "config.toml").write_text('model = "x"\n[agent\nmax_turns = 3\n')
    result = heron(heron_home, {}, "run", "hi")
    assert result.returncode == 2
    assert "config.toml:2" in result.stderr and "malformed" in result.stderr


def wait_for(predicate, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


@pytest.mark.parametrize("where", ["model_call", "tool"])
def test_kill_9_keeps_the_users_message_and_history_stays_valid(heron_home, where):
    if where == "model_call":
        first = [ServerReply(text="never seen", delay_s=30)]
    else:
        first = [ServerReply(tool_calls=[("bash", {"command": "sleep 30"})])]
    script = [*first, ServerReply(text="Resumed fine.")]
    with FakeOpenAIServer(script) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI"))}
        env.update({"HERON_HOME": str(heron_home), **openai_env(server.base_url)})
        proc = subprocess.Popen(
            [sys.executable, "-m", "heron", "run", "-c", "k", "the code is 7"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_for(lambda: len(server.requests) >= 1)
        if where == "tool":
            wait_for(lambda: _assistant_rows(heron_home) >= 1)
            time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        store = Store(heron_home / "heron.db")
        conv = store.conversation("k")
        texts = [r.message.text for r in store.branch(conv.id)]
        assert "the code is 7" in texts
        again = heron(heron_home, openai_env(server.base_url), "run", "-c", "k", "still there?")
        assert again.returncode == 0, again.stderr
        sent = server.requests[-1]["messages"]
    assert "Resumed fine." in again.stdout
    assert any(str(m.get("content", "")).startswith("the code is 7") for m in sent)
    assert _openai_history_valid(sent)


def _assistant_rows(home) -> int:
    store = Store(home / "heron.db")
    try:
        return store.query("SELECT COUNT(*) FROM messages WHERE role='assistant'")[0][0]
    finally:
        store.close()


def _openai_history_valid(messages) -> bool:
    """Every assistant tool call is answered by tool messages right after it."""
    for i, m in enumerate(messages):
        for call in m.get("tool_calls") or []:
            following = messages[i + 1 : i + 1 + len(m["tool_calls"])]
            if call["id"] not in {f.get("tool_call_id") for f in following}:
                return False
    return True
