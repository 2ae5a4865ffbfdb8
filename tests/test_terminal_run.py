"""`heron run` for scripts (issue 15, item 5): stdin joined after the argument, --json the same
in-process and through serve, -c / --continue without a key."""

from __future__ import annotations

import asyncio
import io
import json
import os
from io import StringIO

import pytest
from serve_helpers import running_serve
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.channels.script import message_from, run_message, run_once
from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider


def _typed(request) -> str:
    return request.messages[-1].parts[0].text


def _echo(request) -> Reply:
    return Reply([Text(f"echo: {_typed(request)}")], "done", Usage(40, 7, cache_read=10))


def test_stdin_follows_the_argument_as_a_fenced_block():
    text, bad = message_from("summarise", io.BytesIO(b"line one\nline two\n"))
    assert (text, bad) == ("summarise\n\n```\nline one\nline two\n```", 0)
    # a fence inside stdin cannot close the block early
    text, _ = message_from("explain", io.BytesIO(b"```py\nx = 1\n```\n"))
    assert text == "explain\n\n````\n```py\nx = 1\n```\n````"
    assert message_from("just this", io.BytesIO(b"  \n")) == ("just this", 0)
    assert message_from("-", io.BytesIO(b"from stdin")) == ("from stdin", 0)
    assert message_from("x", io.BytesIO(b"bad \xff byte"))[1] == 1


def test_a_pipe_on_stdin_is_read_and_a_terminal_or_dev_null_is_not(tmp_path):
    r, w = os.pipe()
    os.write(w, b"piped")
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        assert message_from("a", pipe)[0] == "a\n\n```\npiped\n```"
    with open(os.devnull, "rb") as null:  # a character device: never waited on
        assert message_from("a", null)[0] == "a"


async def test_json_is_one_object_and_the_same_through_serve_and_in_process():
    async with running_serve(ScriptedProvider(_echo)) as serve:
        through = (StringIO(), StringIO())
        ok = await run_message(
            Settings.load, "hi", "default", "j1", None, False, *through, as_json=True
        )
        assert serve.url
    alone = (StringIO(), StringIO())
    provider = ScriptedProvider(_echo)
    assert await run_once(
        Settings.load(), "hi", "default", "j2", None, False, *alone, provider, as_json=True
    )
    assert ok
    served, local = (json.loads(out.getvalue()) for out, _ in (through, alone))
    assert through[0].getvalue().count("\n") == 1  # one line: nothing else on stdout
    for got, key in ((served, "j1"), (local, "j2")):
        assert set(got) == {
            "reply",
            "conversation",
            "run_id",
            "ok",
            "error",
            "hint",
            "usage",
            "cost_usd",
            "later",
            "stop",
            "unsaved_reply",
        }
        assert got["reply"] == "echo: hi" and got["conversation"] == key
        assert got["ok"] is True and got["error"] is None and got["run_id"].startswith("run_")
        assert got["usage"] == {"input": 40, "output": 7, "cache_read": 10, "cache_write": 0}
        assert got["later"] == []
    assert served["cost_usd"] == local["cost_usd"]


async def test_json_of_a_failed_turn_says_why():
    def broken(request) -> Reply:
        raise RuntimeError("the model is down")

    out, err = StringIO(), StringIO()
    provider = ScriptedProvider(broken)
    ok = await run_once(
        Settings.load(), "hi", "default", "f", None, False, out, err, provider, as_json=True
    )
    got = json.loads(out.getvalue())
    assert not ok and got["ok"] is False and got["error"] and got["reply"] == ""


async def _talk(*keys: str) -> None:
    async with Engine.open(Settings.load(), provider=ScriptedProvider(_echo)) as engine:
        for key in keys:
            await engine.turn(key, "hello")


def _sent(monkeypatch, *, interactive: bool) -> list[tuple[str, str | None]]:
    """(text, key) of each message `heron run` would send; stdin a terminal or not."""
    sent: list[tuple[str, str | None]] = []

    async def fake(load, text, agent, key, model, ephemeral, **kw):
        sent.append((text, key))
        return True

    monkeypatch.setattr("heron.channels.script.run_message", fake)
    monkeypatch.setattr("heron.cli._interactive", lambda: interactive)
    return sent


@pytest.mark.parametrize("args", [["--continue", "go on"], ["-c", "go on"]])
def test_continue_without_a_key_is_the_latest_conversation_not_internal(args, monkeypatch):
    asyncio.run(_talk("older", "latest", "cron:job-1", "heartbeat"))  # internal ones: newer
    sent = _sent(monkeypatch, interactive=True)
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 0, result.output
    assert sent == [("go on", "latest")]


def test_c_key_with_piped_input_stays_a_key(monkeypatch):
    sent = _sent(monkeypatch, interactive=False)
    result = CliRunner().invoke(app, ["run", "-c", "plan", "go on"], input="notes")
    assert result.exit_code == 0, result.output
    assert sent == [("go on\n\n```\nnotes\n```", "plan")]


def test_continue_with_nothing_to_continue_says_how_to_start():
    result = CliRunner().invoke(app, ["run", "--continue", "hi"])
    assert result.exit_code == 2
    assert "no conversation to continue yet" in result.output


def _down(request) -> Reply:
    from heron.errors import FatalProviderError

    raise FatalProviderError("HTTP 400: the model refused the request")


async def _both_ways(provider_of, text: str, key: str) -> list[dict]:
    """`heron run --json` of `text` through a serve, then in this process (key-1, key-2)."""
    out = StringIO()
    async with running_serve(provider_of()):
        served = await run_message(
            Settings.load, text, "default", f"{key}-1", None, False, out, StringIO(), as_json=True
        )
    alone = StringIO()
    local = await run_once(
        Settings.load(), text, "default", f"{key}-2", None, False, alone, StringIO(),
        provider_of(), as_json=True,
    )  # fmt: skip
    got = [json.loads(o.getvalue()) for o in (out, alone)]
    for one, ok in zip(got, (served, local), strict=True):
        assert one["ok"] is ok  # the exit code follows "ok"
    return got


async def test_json_of_a_failed_turn_has_the_error_apart_and_heron_runs_wording():
    for got in await _both_ways(lambda: ScriptedProvider(_down), "hi", "f"):
        key = got["conversation"]
        assert got["ok"] is False and "the model refused" in got["error"]
        assert got["reply"] == ""  # the error's text is in "error", not the reply
        assert f"heron run --retry -c {key}" in got["hint"]
        assert "/retry" not in json.dumps(got).replace("heron run --retry", "")
        assert got["cost_usd"] is None  # the price is unknown: not 0.0


async def test_json_cost_is_null_for_an_unpriced_model_both_ways():
    # The scripted provider's model has no price, through the serve and in this process.
    for got in await _both_ways(lambda: ScriptedProvider(_echo), "hi", "p"):
        assert got["ok"] is True and got["usage"]["output"] == 7 and got["cost_usd"] is None


async def test_json_retry_with_nothing_to_retry_is_not_ok_and_stores_nothing():
    from heron.bus import NOTHING_TO_RETRY
    from heron.store import Store

    got = await _both_ways(lambda: ScriptedProvider(_echo), "/retry", "ghost")
    store = Store(Settings.load().paths.db)
    for one in got:
        assert one["ok"] is False and one["error"] == NOTHING_TO_RETRY and one["reply"] == ""
        assert one["hint"] == f"Send a message first: heron run -c {one['conversation']} TEXT"
        assert store.conversation(one["conversation"]) is None


@pytest.mark.parametrize(
    ("args", "stdin", "said"),
    [
        (["run", "--json"], "", "give a message"),
        (["run", "--json", "-"], "  \n", "the message is empty"),
        (["run", "--json", "--retry"], "", "--retry takes no message and needs -c KEY"),
        # a mistyped key said "Nothing to retry yet." and exited 0 (QA22u L9)
        (["run", "--json", "--retry", "-c", "typo"], "", "no conversation 'typo'"),
        (["run", "--json", "-c", "k", "hi"], None, "malformed TOML"),
        (["run", "--json", "--bogus", "x"], "", "No such option: --bogus"),  # a bad option
        (["run", "--json", "-c", "k", "--model"], "", "'--model' requires an argument"),
    ],
)
def test_json_refusals_are_one_object_too(args, stdin, said):
    if stdin is None:
        (Settings.load().paths.ensure().home / "config.toml").write_text("[agent\n")
    result = CliRunner().invoke(app, args, input=stdin)
    assert result.exit_code == 2
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    got = json.loads(lines[0])
    assert got["ok"] is False and said in got["error"] and got["reply"] == ""
    assert got["hint"]  # what to do: the error's own hint, or that nothing was sent
    assert said in result.stderr  # and the person reads it as before


def test_a_bad_option_without_json_prints_no_json():
    result = CliRunner().invoke(app, ["run", "--bogus", "--", "--json"], input="")
    assert result.exit_code == 2 and result.stdout == ""


def test_json_refuses_a_message_over_the_limit_as_one_object():
    from heron.messages import MESSAGE_LIMIT

    result = CliRunner().invoke(app, ["run", "--json", "-"], input="a" * (MESSAGE_LIMIT + 1))
    got = json.loads(result.stdout)
    assert result.exit_code == 2 and got["ok"] is False and "at most 8 MB" in got["error"]


async def test_a_per_run_environment_override_runs_in_process_while_a_serve_runs(monkeypatch):
    here: list[str] = []

    async def in_process(settings, text, agent, key, *args, **kw) -> bool:
        here.append(settings.env.get("HERON_CONTEXT_WINDOW") or settings.env.get("HERON_MODEL"))
        return True

    monkeypatch.setattr("heron.channels.script.run_once", in_process)
    async with running_serve(ScriptedProvider(_echo)):  # model "scripted", its own window
        for variable, value in (
            ("HERON_CONTEXT_WINDOW", "6000"),  # another window: in this process
            ("HERON_CONTEXT_WINDOW", "128000"),  # the serve's: through it
            ("HERON_MODEL", "another-model"),  # another model: in this process
            ("HERON_MODEL", "scripted"),  # the serve's: through it
        ):
            monkeypatch.setenv(variable, value)
            out, err = StringIO(), StringIO()
            sent = run_message(Settings.load, "/status", "default", "cw", None, False, out, err)
            assert await sent
            if value in ("128000", "scripted"):
                assert out.getvalue().startswith("model: scripted/scripted"), value
                assert err.getvalue() == ""
            else:  # the person is told their run left the serve, and why
                assert f"{variable}={value}" in err.getvalue()
                assert "running in this process instead" in err.getvalue()
            monkeypatch.delenv(variable)
    assert here == ["6000", "another-model"]


async def test_heron_run_s_fast_path_says_when_an_override_takes_it_off_the_serve(
    monkeypatch, capsys
):
    """qa24c M1: a plain `heron run` goes to the serve by a fast path (heron/entry.py); there
    the serve's "cannot honour HERON_MODEL=..." was taken for a serve that is gone, and the
    run left the serve without a word."""
    from heron import entry

    here: list[str] = []

    async def in_process(settings, text, agent, key, *args, **kw) -> bool:
        here.append(text)
        return True

    monkeypatch.setattr("heron.channels.script.run_once", in_process)
    monkeypatch.setattr(entry, "_text", lambda message: message)  # no stdin read here
    async with running_serve(ScriptedProvider(_echo)):  # model "scripted"
        monkeypatch.setenv("HERON_MODEL", "another-model")
        code = await asyncio.to_thread(entry._fast_run, ["hello", "--conversation", "fast"])
    assert code == 0 and here == ["hello"]
    err = capsys.readouterr().err
    assert "HERON_MODEL=another-model" in err and "running in this process instead" in err


def test_serve_differs_names_the_override_the_serve_runs_otherwise():
    from heron.channels.remote import serve_differs

    welcome = {"model_name": "m", "window": 128_000, "base_url": "http://h/v1"}
    assert serve_differs(welcome, {}) is None
    assert serve_differs(welcome, {"HERON_CONTEXT_WINDOW": "128000", "HERON_MODEL": "m"}) is None
    assert serve_differs(welcome, {"HERON_BASE_URL": "http://h/v1/"}) is None
    assert "HERON_CONTEXT_WINDOW=6000" in (
        serve_differs(welcome, {"HERON_CONTEXT_WINDOW": "6000"}) or ""
    )
    assert "128000" in (serve_differs(welcome, {"HERON_CONTEXT_WINDOW": "6000"}) or "")
    assert serve_differs(welcome, {"HERON_CONTEXT_WINDOW": "lots"}) is not None
    assert serve_differs(welcome, {"HERON_MODEL": "other"}) is not None
    assert serve_differs({"model": "openai/m"}, {"HERON_MODEL": "other"}) is None  # an older serve


def _asks(request) -> Reply:
    """ask_user with no time to wait (the deadline passes at once), then a reply."""
    from heron.messages import ToolCall, ToolResult

    if not any(isinstance(p, ToolResult) for m in request.messages for p in m.parts):
        args = {"question": "Which city?", "minutes": 0}
        return Reply([ToolCall("c1", "ask_user", args)], "tool_use", Usage(10, 2))
    return Reply([Text("Went on without it.")], "done", Usage(10, 2))


@pytest.mark.parametrize("served", [False, True])
async def test_a_question_in_a_script_says_how_to_answer_it_and_how_long_it_waits(served):
    """`heron run` cannot be answered where it runs ("reply here" was wrong there): it says
    which other client answers (only through a serve) and how long the run waits."""
    out, err = StringIO(), StringIO()
    if served:
        async with running_serve(ScriptedProvider(_asks)):
            ok = await run_message(Settings.load, "plan", "default", "q1", None, False, out, err)
    else:
        provider = ScriptedProvider(_asks)
        ok = await run_once(
            Settings.load(), "plan", "default", "q1", None, False, out, err, provider
        )
    assert ok, err.getvalue()
    said, notes = out.getvalue(), err.getvalue()
    assert "Which city?\n(Waiting up to 0 minutes for your answer. Run ask_" in said
    assert "reply here" not in said + notes
    assert "this script cannot give" in notes and "heron chat -c q1" in notes
    if served:
        assert "answer it from `heron chat -c q1` or the browser" in notes
    else:
        assert "without `heron serve`" in notes and "heron runs cancel" in notes
    assert said.rstrip().endswith("Went on without it.")


def _spawning(request) -> Reply:
    """The run's turn spawns a subagent and says so; the subagent answers; the turn that
    announces its result answers with what it found."""
    from heron.messages import ToolCall, ToolResult

    said = request.messages[-1]
    if "Conversation: subagent:" in "".join(m.text for m in request.messages):
        return Reply([Text("SUB RESULT: 42")], "done", Usage(10, 2))
    if "spawn one" in said.text:
        return Reply([ToolCall("c1", "spawn", {"task": "find the number"})], "tool", Usage(10, 2))
    if any(isinstance(p, ToolResult) for p in said.parts):
        return Reply([Text("Started a subagent.")], "done", Usage(10, 2))
    return Reply([Text("The subagent found 42.")], "done", Usage(10, 2))


@pytest.mark.parametrize("as_json", [False, True])
async def test_without_a_serve_the_run_prints_the_answer_to_its_subagent_s_result(as_json):
    out, err = StringIO(), StringIO()
    provider = ScriptedProvider(_spawning)
    ok = await run_once(
        Settings.load(), "spawn one", "default", "sp", None, False, out, err, provider,
        as_json=as_json,
    )  # fmt: skip
    assert ok, err.getvalue()
    if as_json:
        got = json.loads(out.getvalue())
        assert got["reply"] == "Started a subagent." and got["ok"] is True
        assert got["later"] == ["The subagent found 42."]
    else:
        assert out.getvalue() == "Started a subagent.\n\nThe subagent found 42.\n"


@pytest.mark.parametrize("word", ["newkey", "older"])  # a key-like word; an existing key
def test_c_word_alone_in_a_terminal_is_a_key_missing_its_message_not_a_message(word, monkeypatch):
    asyncio.run(_talk("older", "latest"))
    sent = _sent(monkeypatch, interactive=True)
    result = CliRunner().invoke(app, ["run", "-c", word])
    assert result.exit_code == 2 and sent == []  # never sent to another conversation
    assert "--continue" in result.output and f"-c {word} TEXT" in result.output


def test_c_sentence_alone_in_a_terminal_goes_to_the_latest_and_says_so(monkeypatch):
    asyncio.run(_talk("older", "latest"))
    sent = _sent(monkeypatch, interactive=True)
    result = CliRunner().invoke(app, ["run", "-c", "and one more thing"])
    assert result.exit_code == 0 and sent == [("and one more thing", "latest")]
    assert "sending it to the latest conversation 'latest'" in result.output


def test_no_message_in_a_script_names_continue(monkeypatch):
    _sent(monkeypatch, interactive=False)
    result = CliRunner().invoke(app, ["run", "-c", "and one more thing"])
    assert result.exit_code == 2 and "--continue TEXT" in result.output


@pytest.mark.parametrize("key", ["", "   ", "a\nb", "red\x1b[31m", "tab\there"])
@pytest.mark.parametrize("command", [["run", "-c", "{key}", "hi"], ["conversations", "show"]])
def test_a_blank_key_or_one_with_control_characters_is_refused(key, command, monkeypatch):
    sent = _sent(monkeypatch, interactive=False)
    args = [a.replace("{key}", key) for a in command]
    args = args if "{key}" in command else [*args, key]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and sent == []
    assert "conversation key" in result.output
    assert ("blank" in result.output) == (not key.strip())


def test_a_refused_key_under_json_is_the_one_object():
    result = CliRunner().invoke(app, ["run", "--json", "-c", "a\nb", "hi"])
    got = json.loads(result.stdout.splitlines()[0])
    assert result.exit_code == 2 and got["ok"] is False and "control" in got["error"]


def test_the_fast_path_leaves_a_bad_key_to_the_full_cli_which_refuses_it():
    from heron.entry import parse_run

    assert parse_run(["--conversation", "a\nb", "hi"]) is None
    assert parse_run(["--conversation", "", "hi"]) is None
    assert parse_run(["--conversation", "plan", "hi"]) is not None
