"""The terminal's polish (issue 15, item 5): --version, table headers, did-you-mean for a
mistyped slash command, /status after /new."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from heron import __version__
from heron.agent import commands
from heron.agent.engine import Engine
from heron.channels import terminal
from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider


def _cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


async def test_the_list_says_how_many_more_there_are_and_keeps_emoji_keys_aligned():
    provider = ScriptedProvider([Reply([Text("a")], "done", Usage(10, 2))] * 4)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        for key in ("one", "two", "🦩trip", "four"):
            await engine.turn(key, "hello")
    lines = _cli("conversations", "list", "--limit", "3").splitlines()
    assert len(lines) == 5  # the header, three, and the line about the others
    assert lines[-1] == (
        "… and 1 older conversation: heron conversations list --limit 4, "
        "or heron conversations search WORDS"
    )
    from rich.cells import cell_len

    updated = [cell_len(line[: line.index(" 20")]) for line in lines[1:4]]
    assert len(set(updated)) == 1  # the UPDATED column starts in one place, 🦩 is two cells
    assert "older" not in _cli("conversations", "list", "--limit", "4")


def test_version_prints_the_package_version():
    assert _cli("--version") == f"heron {__version__}\n"


async def _two_turns() -> None:
    provider = ScriptedProvider([Reply([Text("a")], "done", Usage(10, 2))])
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("talk", "hello")


async def test_every_table_has_a_header_line():
    await _two_turns()
    conversations = _cli("conversations", "list").splitlines()
    assert conversations[0].split() == ["KEY", "UPDATED", "TURNS", "TITLE"]
    assert conversations[1].startswith("talk ")
    runs = _cli("trace", "ls").splitlines()
    assert runs[0].split()[:4] == ["RUN", "STARTED", "CONVERSATION", "STATUS"]
    assert "talk" in runs[1] and runs[1].startswith("run_")
    # the header's columns line up with the row's
    assert runs[0].index("CONVERSATION") == runs[1].index("talk")
    models = _cli("models").splitlines()
    header = models.index(next(line for line in models if line.startswith("PATTERN")))
    assert models[header].split() == ["PATTERN", "WINDOW", "OUTPUT", "TOOLS", "ATTACHMENTS"]
    assert models[header + 1].split() == [
        "claude-*opus*",
        "200,000",
        "32,000",
        "native",
        "images,",
        "PDFs",
    ]
    assert models[-3].split()[-2:] == ["text", "only"]  # the last profile, *llama*


def test_runs_and_memory_lists_have_headers(tmp_path):
    from heron.channels.common import table

    runner = CliRunner()
    out = runner.invoke(app, ["runs", "list"]).output
    assert out.startswith("No runs yet.")  # nothing to head: the empty case says what to do
    buf = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(buf):
        table(("A", "LONGER", "LAST"), [("xx", "y", "free text"), ("x", "yyyyyyyy", "t")])
    assert buf.getvalue().splitlines() == [
        "A   LONGER    LAST",
        "xx  y         free text",
        "x   yyyyyyyy  t",
    ]


def test_suggest_finds_a_command_one_or_two_edits_away():
    assert commands.suggest("/stauts") == "status"  # a swap is one edit
    assert commands.suggest("/statsu now") == "status"
    assert commands.suggest("/nwe") == "new"
    assert commands.suggest("/Reume") == "resume"
    assert commands.suggest("/status") is None  # known
    assert commands.suggest("/foo bar") is None  # far from every command: goes to the model
    assert commands.suggest("/tmp/x.txt is big") is None  # a path, not a command's shape
    assert commands.suggest("hello /stauts") is None
    assert commands.edits("stauts", "status") == 1
    assert commands.edits("kitten", "sitting") == 3


class _Refuse:
    """A connection that fails the test if anything is sent to the agent."""

    async def send(self, *args) -> None:
        raise AssertionError(f"sent to the agent: {args}")


async def test_a_mistyped_command_in_chat_asks_did_you_mean_and_sends_nothing():
    out = io.StringIO()
    console = Console(file=out, width=100)
    state = terminal.ChatState("k", "default")
    view = terminal.TerminalView(console, state)
    handled = await terminal._command("/stauts", None, _Refuse(), state, view, None)  # type: ignore[arg-type]
    assert handled is True
    assert out.getvalue() == "unknown command /stauts; did you mean /status?\n"
    assert await terminal._command("/shwo 1", None, _Refuse(), state, view, None)  # type: ignore[arg-type]
    assert "did you mean /show?" in out.getvalue()
    # a slash word far from every command is the model's (the loop gets it)
    assert not await terminal._command("/foo bar", None, _Refuse(), state, view, None)  # type: ignore[arg-type]


async def test_status_after_new_counts_only_the_new_context():
    usages = {"one": Usage(1000, 50, cache_read=800), "two": Usage(1200, 30, cache_read=900)}
    usages["three"] = Usage(300, 20)

    def reply(request) -> Reply:  # by the message typed; memory's own calls get no facts
        typed = request.messages[-1].parts[0].text
        return Reply([Text("ok")], "done", usages.get(typed, Usage(5, 1)))

    provider = ScriptedProvider(reply)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        await engine.turn("s", "one")
        await engine.turn("s", "two")
        before = (await engine.turn("s", "/status")).reply
        await engine.turn("s", "/new")
        fresh = (await engine.turn("s", "/status")).reply
        await engine.turn("s", "three")
        after = (await engine.turn("s", "/status")).reply
    assert "conversation: s (2 turns)" in before and "context: 1,230 tokens" in before
    assert "conversation: s (0 turns)" in fresh and "context: 0 tokens" in fresh
    assert "cache hit rate: no model calls yet" in fresh
    assert "conversation: s (1 turn)" in after and "context: 320 tokens" in after
    assert "cache hit rate: 0% over the last 1 turn\n" in after


def test_the_prompt_spins_thinking_until_the_first_token_then_says_working(monkeypatch):
    from heron.bus import TurnEvent

    now = [100.0]
    monkeypatch.setattr(terminal.time, "monotonic", lambda: now[0])
    state = terminal.ChatState("k", "default")
    view = terminal.TerminalView(Console(file=io.StringIO()), state)
    assert view.prompt() == "› "
    view.event(TurnEvent("terminal", "c", "k", "turn_start"))
    now[0] = 104.6
    first = view.prompt()
    assert "thinking 5s" in first and first[0] in terminal.SPINNER
    now[0] = 105.1
    assert view.prompt()[0] != first[0]  # the spinner turns as the prompt redraws
    view.event(TurnEvent("terminal", "c", "k", "delta", text="Hi"))
    assert view.prompt() == "working 5s · Ctrl-C stops › "


def test_llama_3_1_to_3_3_have_a_128k_window_and_native_tools():
    from heron.providers.profiles import profile_for

    for name in ("llama3.1", "llama3.2", "llama3.2:3b", "llama3.3:70b", "meta-llama/Llama-3.1-8B"):
        profile = profile_for(name)
        assert (profile.context_window, profile.tool_mode) == (131_072, "native"), name
    assert profile_for("llama3").tool_mode == "fenced"  # older Llamas keep the cautious profile
    assert profile_for("llama2:13b").context_window == 8_192


def test_the_readme_table_of_models_is_the_profiles():
    from pathlib import Path

    from heron.providers.profiles import markdown_table

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert markdown_table() in readme, (
        "README.md's 'Models Heron knows' table differs from heron/providers/profiles.py; "
        "paste the output of: python -c 'from heron.providers.profiles import markdown_table;"
        " print(markdown_table())'"
    )


class _HalfThenHang(ScriptedProvider):
    """A model that streams half a reply, then hangs until the turn is stopped."""

    def __init__(self) -> None:
        import asyncio

        super().__init__([])
        self.streamed = asyncio.Event()

    async def chat(self, request, on_event=None):
        import asyncio

        from heron.request import StreamEvent

        if on_event is not None:
            on_event(StreamEvent("text", "The first half of the answer, "))
            on_event(StreamEvent("text", "read by the person."))
        self.streamed.set()
        await asyncio.Event().wait()  # never answers: only a stop ends this call


async def test_a_stopped_reply_keeps_what_streamed_and_is_marked_interrupted():
    import asyncio

    from heron.agent.turn import REPLY_STOPPED
    from heron.channels.inprocess import connect

    hanging = _HalfThenHang()
    seen: list = []

    async def deliver(item) -> None:
        seen.append(item)

    async with Engine.open(Settings.load(), provider=hanging) as engine:
        async with connect(engine, "terminal", "c1", deliver) as conn:
            await conn.send("tell me", "stop-me", "default")
            await asyncio.wait_for(hanging.streamed.wait(), 10)
            await conn.send("/stop", "stop-me", "default")
            await asyncio.wait_for(conn.settle(), 10)
        conv = engine.store.conversation("stop-me")
        rows = engine.store.branch(conv.id)
        turn = engine.store.turns(conv.id)[0]
    last = rows[-1]
    assert last.role == "assistant" and last.meta.get("interrupted") is True
    assert last.author == "model"  # the model's words, shown as the assistant's (not Heron's)
    assert last.message.parts[0].text == (
        f"The first half of the answer, read by the person.\n\n{REPLY_STOPPED}"
    )
    assert turn.status == "interrupted"
    # the streamed text reached the channel once, as it streamed
    deltas = [e.text for e in seen if getattr(e, "kind", "") == "delta"]
    assert "".join(deltas) == "The first half of the answer, read by the person."


async def test_status_after_a_stopped_turn_counts_what_it_did():
    """Ctrl-C stopped a turn mid-reply (its call made and recorded, its usage never sent):
    /status said "context: 0 tokens" and "cache hit rate: no model calls yet"."""
    import asyncio

    from heron.channels.inprocess import connect

    hanging = _HalfThenHang()
    async with Engine.open(Settings.load(), provider=hanging) as engine:
        async with connect(engine, "terminal", "c1", lambda _item: asyncio.sleep(0)) as conn:
            await conn.send("tell me", "stop-me", "default")
            await asyncio.wait_for(hanging.streamed.wait(), 10)
            await conn.send("/stop", "stop-me", "default")
            await asyncio.wait_for(conn.settle(), 10)
        said = (await engine.turn("stop-me", "/status")).reply or ""
    assert "conversation: stop-me (1 turn)" in said
    context = next(line for line in said.splitlines() if line.startswith("context: "))
    assert context.startswith("context: about ") and "estimated" in context
    assert int(context.split()[2].replace(",", "")) > 0
    assert "no model calls yet" not in said
    assert (
        "cache hit rate: not known: 1 model call so far, stopped before the server counted any"
        in said
    )


def test_a_streamed_reply_is_laid_out_as_the_whole_reply_would_be():
    """Blocks are printed one at a time as they complete; in any chunking the screen shows the
    blank line Markdown puts between blocks, as when the reply is printed at once."""
    from heron.bus import TurnEnd, TurnEvent
    from heron.messages import Usage

    reply = "# Title\n\nFirst paragraph.\n\n```python\nx = 1\n\ny = 2\n```\n\nLast one."
    whole = io.StringIO()
    Console(file=whole, width=60).print(terminal.Markdown(reply))
    end = TurnEnd(True, "done", None, reply, None, None, "run_1", 1, Usage(1, 1), None)
    for size in (1, 3, 7, len(reply)):
        out = io.StringIO()
        view = terminal.TerminalView(Console(file=out, width=60), terminal.ChatState("k", "a"))
        view.event(TurnEvent("terminal", "c", "k", "turn_start"))
        for i in range(0, len(reply), size):
            view.event(TurnEvent("terminal", "c", "k", "delta", text=reply[i : i + size]))
        view.event(TurnEvent("terminal", "c", "k", "turn_end", end=end))
        assert out.getvalue() == whole.getvalue(), size


def test_a_turn_heron_opens_is_labelled_heron_not_as_typed_on_a_channel():
    from heron.bus import TurnEvent

    out = io.StringIO()
    view = terminal.TerminalView(Console(file=out, width=200), terminal.ChatState("k", "default"))
    view.chat_id = "mine"
    result = "[Subagent result, not written by the user] Subagent sa_1 finished."
    view.event(TurnEvent("web", "web-1", "k", "turn_start", result, provenance="announce"))
    view.event(TurnEvent("web", "web-1", "k", "turn_start", "typed there"))
    assert out.getvalue().splitlines() == [f"heron › {result}", "web › typed there"]


def test_background_work_s_message_is_labelled_with_who_said_it():
    """A monitor's or the heartbeat's message is not a bare line: chat says whose it is, also
    when it comes through a serve."""
    from heron.bus import OutboundMessage
    from heron.channels.remote import to_outbound

    out = io.StringIO()
    view = terminal.TerminalView(Console(file=out, width=200), terminal.ChatState("k", "default"))
    event = {"type": "message", "kind": "message", "text": "hello", "by": "the heartbeat check"}
    relayed = to_outbound(event, "terminal", "k")
    assert isinstance(relayed, OutboundMessage) and relayed.by == "the heartbeat check"
    view.message(relayed)
    view.message(OutboundMessage("terminal", "c", "k", "plain", "message"))
    lines = [line.strip() for line in out.getvalue().splitlines() if line.strip()]
    assert lines == ["from the heartbeat check:", "hello", "plain"]


class _Listing:
    """A serve's connection as /resume uses it: two conversations listed, sends kept."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def conversations(self, limit: int) -> list[tuple[str, str | None]]:
        return [("plan", "Draft a plan"), ("trip", None)]

    async def send(self, text: str, *args) -> None:
        self.sent.append(text)

    def news(self) -> list[str]:
        return []


class _Typed:
    """A prompt session that answers each prompt with the next typed line."""

    def __init__(self, *lines: str) -> None:
        self.lines = list(lines)

    async def prompt_async(self, *args, **kwargs) -> str:
        return self.lines.pop(0)


async def _resume(*typed: str) -> tuple[str, _Listing, _Typed]:
    out = io.StringIO()
    state = terminal.ChatState("k", "default")
    view = terminal.TerminalView(Console(file=out, width=100), state)
    conn, session = _Listing(), _Typed(*typed)
    await terminal._command("/resume", None, conn, state, view, session)  # type: ignore[arg-type]
    return out.getvalue(), conn, session


async def test_the_resume_list_says_why_it_refuses_and_asks_again():
    shown, conn, session = await _resume("abc", "99", "2")
    assert "abc is not on the list: type a number from 1 to 2, or Enter to close it." in shown
    assert "99 is not on the list" in shown
    assert conn.sent == ["/resume trip"] and not session.lines
    shown, conn, _ = await _resume("")
    assert "Closed the list; still in k." in shown and conn.sent == []


async def test_exit_at_the_resume_list_leaves_the_chat_not_the_list_alone():
    with pytest.raises(EOFError):  # the chat loop takes it as Ctrl-D: it says Bye and ends
        await _resume("/exit")


async def test_show_and_edit_with_nothing_to_pick_say_so():
    out = io.StringIO()
    state = terminal.ChatState("k", "default")
    view = terminal.TerminalView(Console(file=out, width=100), state)
    await terminal._command("/show 1", None, _Refuse(), state, view, None)  # type: ignore[arg-type]
    said = " ".join(out.getvalue().split())
    assert said == (
        "No tool calls shown in this chat yet: /show N opens the Nth one it shows. "
        "Earlier ones: heron conversations show k"
    )
    async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
        said = await engine.turn("fresh", "/edit 1 hello")
    assert said.reply == "Nothing to edit yet: /edit N TEXT replaces a message you sent."


async def test_help_points_to_a_real_model_only_while_the_offline_demo_answers():
    """/help ended with how to set up "a real model (not the offline demo)" whatever model
    answered."""
    shown = {}
    for embedded in (False, True):
        out = io.StringIO()
        state = terminal.ChatState("k", "default", embedded=embedded)
        view = terminal.TerminalView(Console(file=out, width=200), state)
        assert await terminal._command("/help", None, _Refuse(), state, view, None)  # type: ignore[arg-type]
        shown[embedded] = out.getvalue()
    assert "/status" in shown[False] and "A real model" not in shown[False]
    assert "A real model (not the offline demo)" in shown[True]
    assert commands.help_text(embedded=False) == commands.HELP
    assert commands.help_text(embedded=True).startswith(commands.HELP + "\nA real model")


def test_the_review_at_exit_waits_for_a_usable_model():
    """The chat's memory review at exit runs with the chat's model: not after a turn failed
    for want of one (key refused, server down), nor when no turn was answered."""
    from heron.bus import TurnEnd
    from heron.errors import AuthError, TransientProviderError, model_unusable

    assert model_unusable(AuthError("HTTP 401: bad key", status=401))
    assert model_unusable(TransientProviderError("connection to the model server failed"))
    assert not model_unusable(TransientProviderError("HTTP 500: boom", status=500))
    state = terminal.ChatState("k", "default")
    view = terminal.TerminalView(Console(file=io.StringIO()), state)
    assert state.why_no_review() == "no turn was answered"
    view.ended(TurnEnd(False, "failed", "HTTP 500: boom"))
    assert state.why_no_review() == "no turn was answered"
    view.ended(TurnEnd(True, "delivered"))
    assert state.why_no_review() is None
    view.ended(TurnEnd(False, "failed", "connection failed\nhint", unusable=True))
    assert state.why_no_review() == "the model's last call failed (connection failed)"
    view.ended(TurnEnd(True, "delivered"))  # working again
    assert state.why_no_review() is None


async def test_a_turn_a_command_runs_counts_for_the_review_at_exit():
    """/retry and /edit run a turn: after a message failed (server down), /retry answered it,
    yet leaving said "the model's last call failed"; a chat whose only answer came from /retry
    said "no turn was answered". The chat's state follows every turn it ran."""
    import asyncio

    from heron.channels.inprocess import connect
    from heron.errors import AuthError

    provider = ScriptedProvider(
        [
            AuthError("HTTP 401: bad key", status=401),
            Reply([Text("Answered at last.")], "done", Usage(10, 2)),
            Reply([Text("Answered the edit.")], "done", Usage(10, 2)),
        ]
    )
    state = terminal.ChatState("k", "default")
    view = terminal.TerminalView(Console(file=io.StringIO()), state)
    async with (
        Engine.open(Settings.load(), provider=provider) as engine,
        connect(engine, "terminal", "c1", view.deliver) as conn,
    ):
        await conn.send("hello", "k", "default")
        await asyncio.wait_for(conn.settle(), 10)
        assert state.why_no_review() == "the model's last call failed (HTTP 401: bad key)"
        state.keys.clear()  # as a chat that only ran /retry here (a resumed one)
        await conn.send("/retry", "k", "default")
        await asyncio.wait_for(conn.settle(), 10)
        assert state.why_no_review() is None and state.keys == ["k"]
        state.answered = False
        await conn.send("/edit 1 hello again", "k", "default")
        await asyncio.wait_for(conn.settle(), 10)
        assert state.why_no_review() is None
        await conn.send("/status", "k", "default")  # no model call: changes nothing
        await asyncio.wait_for(conn.settle(), 10)
    assert state.why_no_review() is None and state.keys == ["k"]


def test_a_turn_another_client_stopped_says_what_stopped_it():
    """The browser's /stop (or another chat's) ended the chat's stream without a word."""
    from heron.bus import TurnEnd

    out = io.StringIO()
    view = terminal.TerminalView(Console(file=out, width=100), terminal.ChatState("k", "default"))
    view.ended(TurnEnd(False, "stale", stopped_by="/stop from the browser"))
    assert "Stopped by /stop from the browser. What the turn finished is kept." in out.getvalue()
    mine = io.StringIO()
    view = terminal.TerminalView(Console(file=mine, width=100), terminal.ChatState("k", "default"))
    view.stopping = True  # this chat sent the /stop: its reply already said "Stopped."
    view.ended(TurnEnd(False, "stale", stopped_by="/stop from heron chat"))
    assert "Stopped by" not in mine.getvalue() and not view.stopping


async def test_a_message_typed_at_the_resume_list_is_sent_not_thrown_away():
    """Words typed at "Number to resume" were refused as "not on the list" and lost."""

    class Session:  # what _pick asks of prompt_toolkit's session
        def __init__(self, said: list[str]) -> None:
            self.said = said

        async def prompt_async(self, _: str) -> str:
            return self.said.pop(0)

    screen = io.StringIO()
    console = Console(file=screen, width=120)
    picked = await terminal._pick(
        Session(["abc", "what did we say about herons?"]), console, 3, "k"
    )
    assert picked == "what did we say about herons?"
    assert "abc is not on the list" in screen.getvalue()  # one word: still a typo of a number
    assert "Closed the list; sending that in k." in screen.getvalue()
    assert await terminal._pick(Session(["2"]), console, 3, "k") == 2


async def test_a_ctrl_c_before_the_message_is_handed_over_stops_the_turn_it_opens():
    """Enter, then Ctrl-C while the chat still reads config.toml before sending: the stop goes
    after the message (before it, it found nothing to stop and the turn ran), and the prompt
    is not left."""
    import asyncio
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from heron.channels.terminal import ChatState, TerminalView, _stop_keys, send_turn

    sent: list[str] = []

    class Conn:
        def running(self, key: str) -> bool:
            return False  # nothing runs yet: the message has not been handed over

        def send_nowait(self, text: str, key: str, agent: str = "default", files=()) -> None:
            sent.append(text)

        async def send(self, text: str, key: str, agent: str = "default", files=()) -> None:
            sent.append(text)

        def news(self) -> list[str]:
            return []

    read = asyncio.Event()

    class Config:
        async def problem(self) -> None:
            await read.wait()  # config.toml being read

    state = ChatState("k", "default", config=Config())  # type: ignore[arg-type]
    view = TerminalView(Console(file=io.StringIO()), state)
    sending = asyncio.create_task(send_turn(Conn(), state, view, "explain"))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    ctrl_c = _stop_keys(Conn(), state, view).bindings[0].handler  # type: ignore[arg-type]
    app = SimpleNamespace(is_running=True, exit=lambda **_: sent.append("left the prompt"))
    ctrl_c(SimpleNamespace(app=app))  # type: ignore[arg-type]
    read.set()
    assert await sending
    assert sent == ["explain", "/stop"]


class _Model:
    """The chat's turns answered ("ok"), the first of them refused (a bad key) when asked;
    memory's review call and /compact's summary answered as their passes expect."""

    def __init__(self, refuse_first: bool) -> None:
        self.refuse = refuse_first

    def __call__(self, request):
        from heron.compaction.summary import SUMMARY_SYSTEM
        from heron.errors import AuthError
        from heron.memory.extract import FACTS_SYSTEM

        if request.system == FACTS_SYSTEM:
            return Reply([Text('{"facts": []}')], "done", Usage(10, 2))
        if request.system == SUMMARY_SYSTEM:
            return Reply([Text("## Facts\nF1\n## Working state\nW1")], "done", Usage(10, 2))
        if self.refuse:
            self.refuse = False
            raise AuthError("HTTP 401: bad key", status=401)
        return Reply([Text("ok")], "done", Usage(10, 2))


async def test_learn_and_compact_count_for_the_review_at_exit(monkeypatch):
    """The review at exit reads what is new past the review cursor, whatever produced it, and
    a skip gives its true reason. /learn after the last message reviewed it: leaving said "the
    model's last call failed" (a failure /learn's answered call had overtaken) or started a
    review with nothing to read; a chat that only ran /compact (or /learn) on a resumed
    conversation was not followed at all."""
    import asyncio

    from heron.channels.inprocess import connect

    monkeypatch.setenv("HERON_EMBEDDINGS", "0")
    state = terminal.ChatState("k", "default")
    view = terminal.TerminalView(Console(file=io.StringIO()), state)
    provider = ScriptedProvider(_Model(refuse_first=True))
    async with (
        Engine.open(Settings.load(), provider=provider) as engine,
        connect(engine, "terminal", "c1", view.deliver) as conn,
    ):

        async def typed(text: str) -> tuple[list[str], str | None]:
            await conn.send(text, "k", "default")
            await asyncio.wait_for(conn.settle(), 10)
            return await terminal.exit_review(engine, state)

        assert await typed("I always book a window seat.") == (
            [],
            "the model's last call failed (HTTP 401: bad key)",
        )
        # /learn's review call answered and read the message: nothing new is left
        assert await typed("/learn") == ([], terminal.NOTHING_NEW)
        assert await typed("Hello again.") == (["k"], None)
        assert await typed("/learn") == ([], terminal.NOTHING_NEW)
        for i in range(6):
            await engine.turn("k", f"message {i} " + "words to fold " * 10)  # elsewhere
        # a chat that only compacted this resumed conversation: its summary call answered
        state.keys.clear()
        state.answered = False
        assert await typed("/compact") == (["k"], None)


@pytest.mark.usefixtures("home_db")  # the branch's chain read on both backends
async def test_the_list_counts_the_turns_of_the_current_branch_and_says_its_branches():
    """A conversation with one retried turn listed more turns than the person sees: the
    retried answer's turn is on another branch now."""
    provider = ScriptedProvider([Reply([Text("a")], "done", Usage(10, 2))] * 4)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        for text in ("hello", "again", "/retry"):
            await engine.turn("retried", text)
        await engine.turn("plain", "only one")
    rows = {line.split()[0]: line for line in _cli("conversations", "list").splitlines()[1:]}
    assert " 2 (2 branches) " in rows["retried"]
    assert " 1 " in rows["plain"] and "branch" not in rows["plain"]


NARROW = 40  # columns of a small terminal pane (QA22u L12)


async def test_help_wraps_each_description_under_itself_at_40_columns():
    """At 40 columns /help's descriptions wrapped back to column 0, under the command names."""
    out = io.StringIO()
    state = terminal.ChatState("k", "default", embedded=True)
    view = terminal.TerminalView(Console(file=out, width=NARROW), state)
    assert await terminal._command("/help", None, _Refuse(), state, view, None)  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert all(len(line) <= NARROW for line in lines), lines
    entry = False
    for line in lines:
        if line.startswith("  /"):
            entry = True  # a command's row; its description's later lines are indented
        elif entry and line.startswith("    "):
            continue
        else:
            assert not (entry and line[:1].islower()), line  # a description at column 0
            entry = False
    said = " ".join(out.getvalue().split())
    assert "/new start afresh: the model forgets this conversation, the transcript stays" in said


async def test_the_review_notice_at_exit_wraps_between_words(monkeypatch):
    """It was written unwrapped, and a 40-column terminal broke it mid-word (`ba|ckground`)."""
    from heron.memory.commands import closing_notice

    def review(settings, model, choice, keys, *, say):
        say(closing_notice(choice))
        return True

    async def new_since(engine, state):
        return ["k"], None

    monkeypatch.setattr(terminal, "review_on_close", review)
    monkeypatch.setattr(terminal, "exit_review", new_since)
    out = io.StringIO()
    state = terminal.ChatState("k", "default")
    state.keys.append("k")
    async with Engine.open(Settings.load(), provider=ScriptedProvider([])) as engine:
        console = Console(file=out, width=NARROW)
        await terminal._review_at_exit(Settings.load(), None, engine, state, console)
        notice = closing_notice(engine.choice)
    lines = out.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= NARROW for line in lines), lines
    assert " ".join(out.getvalue().split()) == notice
