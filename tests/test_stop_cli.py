"""What the person reads when a `heron run` is stopped from elsewhere, as real processes: the
stopped run ends at once (not when its stream would have ended), keeps what it printed as the
interrupted answer, says what stopped it and exits 1; --retry is offered after /stop, not after
/new. A command waiting for approval is named when the stop declines it. Against a fake OpenAI
server, with and without a `heron serve`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from procs import reap, spawn  # noqa: F401  (reap: an autouse fixture)
from serve_helpers import ServeProcess, clean_env

from heron.agent.turn import REPLY_STOPPED
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # real processes

REPLY = "Here is the first part of a long answer, and much more that never comes"


def _model(resume: threading.Event) -> Any:
    """A reply that streams a few pieces, then waits for `resume` (never set while the run
    lives); any message saying "and now" is answered at once."""

    def reply(body: dict[str, Any]) -> ServerReply:
        last = json.dumps(body["messages"][-1])
        if "and now" in last:
            return ServerReply(text="fine")
        return ServerReply(text=REPLY, chunk_size=6, stall_after_events=4, resume=resume)

    return reply


def _env(server: FakeOpenAIServer) -> dict[str, str]:
    return {"HERON_BASE_URL": server.base_url, "HERON_MODEL": "fake-model", "HERON_API_KEY": "k"}


def _run(home: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    proc = spawn([sys.executable, "-m", "heron", "run", *args], clean_env(home, env))
    assert proc.stdin is not None
    proc.stdin.close()  # a pipe left open is read as part of the message, to its end
    proc.stdin = None
    return proc


def _started(proc: subprocess.Popen[str]) -> str:
    """The first characters the run printed: its reply is streaming. Read from the descriptor
    itself: what a buffered read took beyond them would be lost to `communicate`."""
    assert proc.stdout is not None
    return os.read(proc.stdout.fileno(), 64).decode()


def _transcript(home: Path, key: str) -> tuple[list[tuple[str, str]], tuple[str, int]]:
    store = Store(home / "heron.db")
    try:
        conversation = store.conversation(key)
        assert conversation is not None
        rows = [(m.role, m.message.text) for m in store.branch(conversation.id)]
        turn = store.turns(conversation.id)[0]
        return rows, (turn.status, turn.model_calls)
    finally:
        store.close()


def test_a_run_stopped_from_another_process_stops_says_so_and_keeps_what_it_printed(
    heron_home: Path,
):
    resume = threading.Event()
    with FakeOpenAIServer(_model(resume)) as server:
        env = _env(server)
        first = _run(heron_home, env, "--stream", "-c", "ST", "tell me everything")  # live
        shown = _started(first)
        stop = _run(heron_home, env, "-c", "ST", "/stop")
        stopped, _ = stop.communicate(timeout=60)
        try:
            out, err = first.communicate(timeout=30)  # not when the stream would have ended
        finally:
            resume.set()
        rows, figures = _transcript(heron_home, "ST")
        after = _run(heron_home, env, "-c", "ST", "and now?")
        after.communicate(timeout=60)
        seen = server.requests[-1]["messages"]
    assert stop.returncode == 0 and f"Stopped a turn in process {first.pid}." in stopped
    printed = shown + out
    assert printed.strip() and REPLY.startswith(printed.strip())  # cut short
    assert first.returncode == 1
    assert err.splitlines()[-2:] == [
        f"heron: the turn was stopped by /stop from heron run (process {stop.pid}). What it "
        "finished is kept.",
        "Your message is saved in conversation 'ST'; `heron run --retry -c ST` answers it again "
        "without storing it twice.",
    ]
    kept = f"{printed.strip()}\n\n{REPLY_STOPPED}"
    assert rows == [("user", "tell me everything"), ("assistant", kept)]
    assert figures == ("interrupted", 1)
    assert {"role": "assistant", "content": kept} in seen  # the model reads what was shown


@pytest.mark.parametrize("command", ["stop", "new"])
def test_a_run_through_the_serve_says_which_command_stopped_it(heron_home: Path, command: str):
    resume = threading.Event()
    with FakeOpenAIServer(_model(resume)) as server, ServeProcess(heron_home, _env(server)):
        env = _env(server)
        first = _run(heron_home, env, "--stream", "-c", "SV", "tell me everything")
        _started(first)
        other = _run(heron_home, env, "-c", "SV", f"/{command}")
        other.communicate(timeout=60)
        try:
            _, err = first.communicate(timeout=30)
        finally:
            resume.set()
    assert first.returncode == 1 and "the turn failed" not in err
    said = f"heron: the turn was stopped by /{command} from heron run. What it finished is kept."
    assert said in err.splitlines()
    if command == "stop":
        assert "`heron run --retry -c SV` answers it again" in err
    else:  # after /new the model starts afresh: --retry would not answer it there
        assert "--retry" not in err
        assert "The model starts afresh in conversation 'SV' from here; send your message " in err


def test_a_stop_while_a_command_waits_for_approval_names_the_command(heron_home: Path):
    marker = heron_home / "approved-ran"
    command = f"touch {marker}"
    script = [ServerReply(tool_calls=[("bash", {"command": command})])]
    unconfined = {"HERON_BWRAP": "off"}
    with FakeOpenAIServer(script) as server:
        env = {**_env(server), **unconfined}
        with ServeProcess(heron_home, env) as serve:
            (notice,) = [line for line in serve.said if "No sandbox" in line]
            first = _run(heron_home, env, "-c", "AP", "touch it")
            assert first.stderr is not None
            while "waiting for an answer" not in first.stderr.readline():
                pass
            _run(heron_home, env, "-c", "AP", "/stop").communicate(timeout=60)
            _, err = first.communicate(timeout=30)
    assert notice.startswith("heron: No sandbox: bubblewrap is turned off (HERON_BWRAP=off).")
    assert "not installed" not in notice and "unset HERON_BWRAP" in notice
    assert f"heron: {command!r} declined: the turn was stopped" in err.splitlines()
    assert "heron: the turn was stopped by /stop from heron run." in err
    assert first.returncode == 1 and not marker.exists()
