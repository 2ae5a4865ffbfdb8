"""`heron run` as a Unix tool (QA17f #2, #5, #11): a reader of stdout that went away
(`| head -1`) ends the run at once, exit 141, its turn kept (stopped as Ctrl-C stops it in this
process, finished whole by a serve), never a hang and never "the serve stopped"; SIGINT and
SIGTERM stop the turn as /stop does, the JSON object still printed, exit 130 or 143; and
`heron chat` with no terminal on stdin says to use `heron run`, in one line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
from serve_helpers import running_serve
from test_e2e_cli import openai_env

from heron.agent.turn import REPLY_STOPPED
from heron.channels import script
from heron.channels.early import catch_early_signals
from heron.channels.script import PIPE_CLOSED, UNSENT, RunCut, run_message, run_once
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest, OnEvent, StreamEvent
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

WAIT = 30  # seconds; only a hang reaches it


class Streams(ScriptedProvider):
    """Streams "Hello, " and "I am", then waits for `release` (never set: only a stop ends
    the call), then answers the rest."""

    def __init__(self) -> None:
        super().__init__(lambda request: Reply([Text("next")], "done", Usage(5, 1)))
        self.streaming, self.release = asyncio.Event(), asyncio.Event()

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        self.requests.append(request)
        for piece in ("Hello, ", "I am"):
            if on_event is not None:
                on_event(StreamEvent("text", piece))
        self.streaming.set()
        await self.release.wait()
        return Reply([Text("Hello, I am whole.")], "done", Usage(5, 3))


class Terminal(StringIO):
    def isatty(self) -> bool:
        return True


class HeadOne(Terminal):
    """stdout read by `head -c 7`: it takes the first piece, then its reader is gone. It says
    it is a terminal so that the reply streams to it (a pipe gets the reply whole at the end,
    and its reader leaving is seen by the watch on the descriptor: the subprocess test)."""

    def write(self, text: str) -> int:
        if self.getvalue():
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


def _record(key: str) -> tuple[list[tuple[str, str]], list[str]]:
    store = Store(Settings.load().paths.db)
    try:
        conversation = store.conversation(key)
        assert conversation is not None
        rows = [(r.role, r.message.text) for r in store.branch(conversation.id)]
        return rows, [t.status for t in store.turns(conversation.id)]
    finally:
        store.close()


async def _run(served: bool, provider: Streams, out, err, key: str, **kw) -> int:
    """`heron run` of "go" on `key`: its exit status as cli.run gives it."""
    if served:
        sent = run_message(Settings.load, "go", "default", key, None, False, out, err, **kw)
    else:
        settings = Settings.load()
        sent = run_once(settings, "go", "default", key, None, False, out, err, provider, **kw)
    try:
        return 0 if await asyncio.wait_for(sent, WAIT) else 1
    except RunCut as cut:
        return cut.code


async def test_a_closed_stdout_stops_the_turn_in_process_and_keeps_it():
    provider, out, err = Streams(), HeadOne(), StringIO()
    assert await _run(False, provider, out, err, "pipe") == PIPE_CLOSED
    assert out.getvalue() == "Hello, "
    assert "failed" not in err.getvalue() and "--retry" not in err.getvalue()  # quietly
    rows, turns = _record("pipe")  # the message kept once, what streamed kept with it
    assert rows == [("user", "go"), ("assistant", f"Hello, I am\n\n{REPLY_STOPPED}")]
    assert turns == ["interrupted"]


async def test_a_closed_stdout_through_a_serve_leaves_the_turn_to_finish_whole():
    provider, out, err = Streams(), HeadOne(), StringIO()
    async with running_serve(provider):
        assert await _run(True, provider, out, err, "pipe") == PIPE_CLOSED
        said = err.getvalue()
        assert "serve stopped" not in said and "--retry" not in said and "failed" not in said
        provider.release.set()  # the serve goes on with the turn its client left
        for _ in range(WAIT * 20):
            if _record("pipe")[1] == ["done"]:
                break
            await asyncio.sleep(0.05)
        rows, turns = _record("pipe")
    assert rows == [("user", "go"), ("assistant", "Hello, I am whole.")] and turns == ["done"]


CUTS = (signal.SIGINT, signal.SIGTERM)


class Unhandled(Exception):
    """A signal that reached the test's handler: heron run did not take it."""


@pytest.fixture
def guarded():
    """SIGINT, SIGTERM and SIGHUP raise here unless heron run takes them; put back after."""

    def unhandled(number, frame):
        raise Unhandled(signal.Signals(number).name)

    before = {n: signal.signal(n, unhandled) for n in (*CUTS, signal.SIGHUP)}
    yield
    for number, handler in before.items():
        signal.signal(number, handler)
    script._EARLY.clear()


@pytest.mark.usefixtures("guarded")
@pytest.mark.parametrize("served", [False, True], ids=["in-process", "served"])
@pytest.mark.parametrize(
    "number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["TERM", "INT", "HUP"]
)
async def test_a_signal_stops_the_turn_as_ctrl_c_does_and_the_json_says_so(number, served):
    """SIGHUP (qa22v L1): the run died at once, and `--json > file` was left empty."""
    provider, out, err = Streams(), StringIO(), StringIO()
    key = f"sig-{number.name}"

    async def kill() -> None:
        await provider.streaming.wait()
        os.kill(os.getpid(), number)

    async with running_serve(provider) if served else contextlib.nullcontext():
        killer = asyncio.create_task(kill())
        code = await _run(served, provider, out, err, key, as_json=True)
        await killer
    assert code == 128 + number
    got = json.loads(out.getvalue())
    assert got["ok"] is False and got["error"] == f"stopped by {number.name}"
    assert got["reply"] == "Hello, I am" and f"heron run --retry -c {key}" in got["hint"]
    rows, turns = _record(key)
    assert rows == [("user", "go"), ("assistant", f"Hello, I am\n\n{REPLY_STOPPED}")]
    assert turns == ["interrupted"]


@pytest.mark.usefixtures("guarded")
async def test_a_signal_before_the_message_went_out_sends_nothing_and_says_so():
    catch_early_signals()  # as heron/entry.py does first
    os.kill(os.getpid(), signal.SIGTERM)  # while Python imports, say
    out, err = StringIO(), StringIO()
    code = await _run(False, Streams(), out, err, "early", as_json=True)
    assert code == 128 + signal.SIGTERM
    got = json.loads(out.getvalue())
    assert got["error"] == "stopped by SIGTERM before the message was sent"
    assert got["hint"] == UNSENT and got["ok"] is False
    assert Store(Settings.load().paths.db).conversation("early") is None


@pytest.mark.usefixtures("guarded")
async def test_a_signal_the_parent_ignores_stays_ignored_under_nohup():
    """`nohup heron run ...` ignores SIGHUP: taking it would stop the turn nohup keeps."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    catch_early_signals()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    provider, out, err = Streams(), StringIO(), StringIO()

    async def hang_up() -> None:
        await provider.streaming.wait()
        os.kill(os.getpid(), signal.SIGHUP)  # passed over
        await asyncio.sleep(0.05)
        provider.release.set()

    task = asyncio.create_task(hang_up())
    assert await _run(False, provider, out, err, "nohup") == 0
    await task
    assert _record("nohup")[1] == ["done"]


# ---- the real command ----------------------------------------------------------------------

# Some lines, then the model stalls: only the run's end (or the server's) ends the stream.
STALLS = ServerReply(text="line one\nline two\nline three\n", chunk_size=9, stall_after_events=4)


def _heron(home, url: str, *args: str, **kw) -> subprocess.Popen[str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
    }
    env.update(HERON_HOME=str(home), **openai_env(url))
    command = [sys.executable, "-m", "heron", "run", *args]
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stdin", subprocess.DEVNULL)  # never the test runner's own stdin
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.slow
def test_heron_run_piped_to_a_reader_that_leaves_ends_at_once_with_141(heron_home):
    with FakeOpenAIServer([STALLS]) as server:
        proc = _heron(heron_home, server.base_url, "--stream", "-c", "head", "go")  # live
        assert proc.stdout is not None and proc.stdout.readline() == "line one\n"
        proc.stdout.close()  # `| head -1`: the model still streams nothing, and nothing waits
        assert proc.wait(WAIT) == PIPE_CLOSED
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    assert _record("head")[1] == ["interrupted"]


@pytest.mark.slow
def test_heron_run_with_stdout_closed_refuses_before_sending(heron_home):
    with FakeOpenAIServer([STALLS]) as server:
        closed = _heron(
            heron_home, server.base_url, "go", stdout=None, preexec_fn=lambda: os.close(1)
        )  # fmt: skip
        assert closed.wait(WAIT) == 2
        assert closed.stderr is not None and "stdout is closed" in closed.stderr.read()
        assert server.requests == []


@pytest.mark.slow
def test_heron_run_json_under_sigterm_prints_the_object_and_exits_143(heron_home):
    with FakeOpenAIServer([STALLS]) as server:
        proc = _heron(heron_home, server.base_url, "--json", "-c", "t", "go")
        for _ in range(WAIT * 20):  # until the model is streaming
            if server.requests:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, said = proc.communicate(timeout=WAIT)
    assert proc.returncode == 143, said
    got = json.loads(out)
    assert got["ok"] is False and got["error"] == "stopped by SIGTERM"


@pytest.mark.parametrize("stdin", ["hello\n", ""], ids=["piped", "empty"])
def test_heron_chat_without_a_terminal_says_to_use_heron_run(stdin):
    from typer.testing import CliRunner

    from heron.cli import app

    result = CliRunner().invoke(app, ["chat", "-c", "up"], input=stdin)  # stdin: not a tty
    assert result.exit_code == 2, result.exception
    (line,) = result.stderr.splitlines()  # one line, no traceback
    assert "heron chat needs a terminal" in line and "heron run" in line


async def test_a_notice_after_the_reply_starts_on_a_line_of_its_own():
    """A goal parked as its turn ends: the notice went on the end of the reply's line (in a
    terminal, where the reply streams and stdout and stderr share the screen)."""
    from heron.bus import OutboundMessage, TurnEvent

    out, err = Terminal(), StringIO()
    printer = script.ReplyPrinter(out, err)
    await printer.deliver(TurnEvent("script", "c", "g", "delta", text="count to three"))
    await printer.deliver(OutboundMessage("script", "c", "g", "Goal parked: ...", "notice"))
    assert out.getvalue() == "count to three\n" and err.getvalue() == "Goal parked: ...\n"


TWICE = """
import sys
from typer.testing import CliRunner
from heron.cli import app
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
with FakeOpenAIServer([ServerReply(text="one"), ServerReply(text="two")]) as server:
    env = {"HERON_BASE_URL": server.base_url, "HERON_MODEL": "gpt-4o-mini", "OPENAI_API_KEY": "x"}
    for n in range(2):
        print(CliRunner().invoke(app, ["run", "-c", "t", f"hello {n}"], env=env).output.strip())
"""


def test_heron_run_twice_in_one_process_prints_both_replies(heron_home):
    """The streams `heron run` writes to are read when it runs, not when its module was first
    imported: a second run in one process (CliRunner swaps them per call) hung, its replies
    written to the first call's closed stream."""
    done = subprocess.run(
        [sys.executable, "-c", TWICE], capture_output=True, text=True, timeout=WAIT * 4
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["one", "two"]


def test_the_early_signal_handler_is_in_place_before_heron_run_imports_its_channel():
    """qa21s #9: a SIGINT while `heron run` imported heron.channels.script (the first ~0.2 s)
    gave a KeyboardInterrupt traceback: the handler that keeps it came with that import. It
    is in place before any import but the entry point's and its own module's."""
    import subprocess
    import sys

    spy = """
import builtins, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, not a background job
seen = {}
real = builtins.__import__
def spy(name, *args, **kwargs):
    light = name in ("heron", "heron.entry", "heron.channels", "heron.channels.early")
    if name.startswith("heron") and not light and "at" not in seen:
        seen["at"] = (name, signal.getsignal(signal.SIGINT))
    return real(name, *args, **kwargs)
builtins.__import__ = spy
sys.argv = ["heron", "run", "--no-such-option-here"]
import heron.entry
try:
    heron.entry.main()
except SystemExit:
    pass
name, handler = seen["at"]
print("HANDLER", getattr(handler, "__name__", None), "AT", name)
"""
    done = subprocess.run(
        [sys.executable, "-c", spy], capture_output=True, text=True, timeout=120, check=False
    )
    assert "HANDLER _early" in done.stdout, done.stdout + done.stderr


def test_the_cyclic_collector_is_off_while_heron_starts_and_on_after():
    """heron/entry.py: no collection while the SDKs are imported (their objects are not
    garbage), the usual collections once the process has started."""
    code = (
        "import gc, time\n"
        "from heron import entry\n"
        "entry.COLLECT_AFTER_S = 0.2\n"
        "entry._collect_later()\n"
        "starting = gc.isenabled()\n"
        "deadline = time.monotonic() + 30\n"  # a bound for a busy machine, not a pace
        "while not gc.isenabled() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(starting, gc.isenabled())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr
