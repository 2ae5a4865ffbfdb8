"""`heron trace replay` of a run recorded by the real `heron` command: a freshly recorded run,
with the tools a person's run gets (the proactive ones included), replays with identical
requests, whether the run went through a `heron serve` or ran in-process, and with
`--live-tools`. The runs are real processes (what they record is the point); the listing and
the replays, which only read the home, run the same command in this process (typer's
CliRunner): seven processes less a mode (9.1 -> 4.2 s of CPU for both)."""

from __future__ import annotations

import pytest
from serve_helpers import maybe_serve
from test_e2e_cli import MODES, heron, openai_env
from typer.testing import CliRunner

from heron.cli import app
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # the real CLI in subprocesses


@MODES
def test_a_fresh_run_replays_identically_with_the_tools_it_had(heron_home, mode):
    script = [
        ServerReply(text="Echo: just a plain message"),
        ServerReply(tool_calls=[("bash", {"command": "echo hi"})]),
        ServerReply(text="It said hi."),
    ]
    with (
        FakeOpenAIServer(script) as server,
        maybe_serve(mode, heron_home, env := openai_env(server.base_url)),
    ):
        plain = heron(heron_home, env, "run", "-c", "rp", "just a plain message")
        tool = heron(heron_home, env, "run", "-c", "rp", "run echo hi")
        requests = server.requests
    assert plain.returncode == 0 and tool.returncode == 0, plain.stderr + tool.stderr
    # What the run had: the proactive tools are in the list the model was sent.
    offered = [t["function"]["name"] for t in requests[0]["tools"]]
    assert {"spawn", "ask_user", "goal"} <= set(offered)
    cli = CliRunner()  # the home is HERON_HOME already (conftest), no provider set
    listed = cli.invoke(app, ["trace", "ls", "--conversation", "rp"])
    runs = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert len(runs) == 2, listed.output
    for run in runs:
        for flags in ([], ["--live-tools"], ["--recorded-tools"]):
            replayed = cli.invoke(app, ["trace", "replay", run, *flags])
            assert replayed.exit_code == 0, replayed.output
            assert "every request is identical to the recorded one" in replayed.stdout
            assert "differs" not in replayed.stdout and "note:" not in replayed.stdout
