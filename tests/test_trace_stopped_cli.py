"""A turn stopped in `heron chat` (the real command in a pty, in-process and through a
`heron serve`) while its reply streams: `heron trace` keeps its model call (the request the
server got, what streamed) and every cost listing says `?` rather than $0.0000. The chat is the
real process; the listings after it, which only read the home, run the same commands in this
process (typer's CliRunner): four processes less a mode."""

from __future__ import annotations

import json

import pytest
from serve_helpers import maybe_serve
from test_chat_screen import ChatScreen, _env
from test_e2e_cli import MODES
from typer.testing import CliRunner

from heron.cli import app
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # the real CLI in a pty and in subprocesses


@MODES
def test_a_stop_in_the_chat_keeps_the_call_and_its_cost_unknown(heron_home, mode):
    text = "The first paragraph streams.\n\nAnd then a great deal more."
    reply = ServerReply(text=text, chunk_size=4, stall_after_events=9)
    with FakeOpenAIServer([reply]) as server, maybe_serve(mode, heron_home, _env(server.base_url)):
        chat = ChatScreen(heron_home, server.base_url)
        chat.type("explain\r")
        chat.wait_for(lambda: chat.shows("The first"), "the streamed text")
        chat.type("/stop\r")
        chat.wait_for(lambda: chat.shows("Stopped."), "the stop")
        chat.wait_for(lambda: chat.prompt() == "›", "the end of the turn")
        chat.leave()
        sent = server.requests[0]
    cli = CliRunner()  # the home is HERON_HOME already (conftest), no provider set
    listed = cli.invoke(app, ["trace", "ls"])
    (row,) = listed.stdout.splitlines()[1:]
    run, *_, status, calls, _tools, _in, _out, cost = row.split()
    assert (status, calls, cost) == ("interrupted", "1", "?"), row
    assert '[prices."fake-model"]' in listed.stderr  # how to price it, beside the table
    shown = cli.invoke(app, ["trace", "show", run]).stdout
    assert "streamed: The first" in shown and "stopped before the reply ended" in shown
    exported = json.loads(cli.invoke(app, ["trace", "export", run]).stdout)
    (call,) = exported["model_calls"]
    assert call["request"] == sent  # the exact body the server received
    assert call["streamed"]["parts"][0]["text"].startswith("The first")
    assert exported["turn"]["usage_unknown"] is True
    usage = cli.invoke(app, ["usage"]).stdout
    totals = [line.split()[-1] for line in usage.splitlines() if line.startswith("total")]
    assert totals == ["?", "?"] and "$0.0000" not in usage
