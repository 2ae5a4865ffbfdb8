"""Command approvals in `heron serve` when commands cannot be confined (HERON_BWRAP=off, so
approval is "ask"): every client of the conversation is asked, the first answer decides, /stop
declines, a client that attaches while one waits is asked too, and the terminal through the
serve (heron/channels/remote.py) answers with the person's y. Real serve, scripted model."""

from __future__ import annotations

import asyncio
import json
import shutil
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from serve_helpers import LineClient, running_serve, ws_client, ws_hello, ws_until

from heron.agent import approvals
from heron.bus import Outbound
from heron.channels.remote import connect_remote
from heron.channels.script import run_message
from heron.channels.terminal import ChatState, TerminalView
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall, ToolResult, Usage
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.tools.approval import DECLINED

COMMAND = "echo approved-'and'-ran && echo '<b>not html</b>'"
OUTPUT = "approved-and-ran"


@pytest.fixture(autouse=True)
def unconfined(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine where bubblewrap cannot run: approval is "ask"."""
    monkeypatch.setenv("HERON_BWRAP", "off")


def _model(request: ChatRequest) -> Reply:
    """Runs COMMAND, then says what its result was."""
    results = [p for m in request.messages for p in m.parts if isinstance(p, ToolResult)]
    if results:
        return Reply([Text(f"Result: {results[-1].content}")], "done", Usage(10, 2))
    return Reply([ToolCall("c1", "bash", {"command": COMMAND})], "tool_use", Usage(10, 2))


def _serve() -> Any:
    return running_serve(ScriptedProvider(_model))


async def _send(ws: Any, message: dict[str, Any]) -> None:
    await ws.send(json.dumps(message))


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


async def test_a_client_is_asked_the_exact_command_and_allowing_it_runs_it():
    async with _serve() as serve, ws_client(serve) as ws:
        welcome = await ws_hello(ws, "approve")
        await _send(ws, {"type": "send", "text": "run it"})
        before = await ws_until(ws, "approval")
        asked = before[-1]
        assert (asked["tool"], asked["command"], asked["confined"]) == ("bash", COMMAND, False)
        assert _of(before, "tool_start")  # asked once the call is shown, in order
        await _send(ws, {"type": "approve", "id": asked["id"], "allow": True})
        after = await ws_until(ws, "idle")
    (end,) = _of(after, "approval_end")
    assert end == {**end, "id": asked["id"], "allowed": True, "reason": "answered"}
    assert end["by"] == welcome["chat_id"]
    (result,) = _of(after, "tool_end")
    assert OUTPUT in result["result"] and not result["is_error"]
    assert OUTPUT in _of(after, "turn_end")[0]["reply"]


async def test_denying_declines_and_the_model_reads_why():
    async with _serve() as serve, ws_client(serve) as ws:
        await ws_hello(ws, "deny")
        await _send(ws, {"type": "send", "text": "run it"})
        asked = (await ws_until(ws, "approval"))[-1]
        await _send(ws, {"type": "approve", "id": asked["id"], "allow": "no"})  # not a boolean
        refused = (await ws_until(ws, "error"))[-1]
        await _send(ws, {"type": "approve", "id": asked["id"], "allow": False})
        after = await ws_until(ws, "idle")
    assert refused["message"] == "approve needs the approval's id and allow"
    assert [(e["allowed"], e["reason"]) for e in _of(after, "approval_end")] == [
        (False, "answered")
    ]
    (result,) = _of(after, "tool_end")
    assert DECLINED in result["result"] and OUTPUT not in result["result"]


async def test_two_clients_are_asked_and_the_first_answer_decides():
    async with _serve() as serve, ws_client(serve) as one, ws_client(serve) as two:
        await ws_hello(one, "both")
        welcome = await ws_hello(two, "both")
        await _send(one, {"type": "send", "text": "run it"})
        asked = (await ws_until(one, "approval"))[-1]
        assert (await ws_until(two, "approval"))[-1] == asked
        await _send(two, {"type": "approve", "id": asked["id"], "allow": False})
        await _send(two, {"type": "approve", "id": asked["id"], "allow": True})  # too late
        ended = (await ws_until(two, "approval_end"))[-1]
        await _send(one, {"type": "approve", "id": asked["id"], "allow": True})  # too late
        seen = await ws_until(one, "idle")
    assert (ended["allowed"], ended["by"]) == (False, welcome["chat_id"])
    assert _of(seen, "approval_end") == [ended]  # told once, the same to both
    assert not _of(seen, "error")  # a late answer is ignored, not refused
    (result,) = _of(seen, "tool_end")
    assert DECLINED in result["result"]


async def test_stop_while_an_approval_waits_declines_it_and_leaves_nothing_waiting():
    async with _serve() as serve, ws_client(serve) as ws:
        await ws_hello(ws, "stop")
        await _send(ws, {"type": "send", "text": "run it"})
        asked = (await ws_until(ws, "approval"))[-1]
        await _send(ws, {"type": "stop"})
        after = await ws_until(ws, "idle")
        await _send(ws, {"type": "approve", "id": asked["id"], "allow": True})  # no longer waits
        async with ws_client(serve) as late:
            await ws_hello(late, "stop", last_seq=None)
            await _send(late, {"type": "command", "text": "/status"})
            status = await ws_until(late, "idle")
    assert [(e["allowed"], e["reason"]) for e in _of(after, "approval_end")] == [(False, "stopped")]
    assert [e["interrupted"] for e in _of(after, "turn_end")] == [True]
    assert "conversation: stop" in _of(status, "turn_end")[0]["reply"]  # /status answered,
    assert not _of(status, "approval")  # and no approval was sent to the client that attached
    assert not any(OUTPUT in e["result"] for e in _of(after, "tool_end"))  # it never ran


async def test_past_its_deadline_an_approval_is_declined_saying_why(monkeypatch):
    monkeypatch.setattr(approvals, "APPROVAL_DEADLINE", 0.2)
    async with _serve() as serve, ws_client(serve) as ws:
        await ws_hello(ws, "late")
        await _send(ws, {"type": "send", "text": "run it"})
        after = await ws_until(ws, "idle")
    assert [(e["allowed"], e["reason"]) for e in _of(after, "approval_end")] == [
        (False, "deadline")
    ]
    (result,) = _of(after, "tool_end")
    assert "nobody answered" in result["result"] and OUTPUT not in result["result"]


async def test_a_terminal_attaching_while_an_approval_waits_is_asked_and_can_answer():
    async with _serve() as serve, ws_client(serve) as ws:
        await ws_hello(ws, "attach")
        await _send(ws, {"type": "send", "text": "run it"})
        asked = (await ws_until(ws, "approval"))[-1]
        terminal = await LineClient.open(serve.info.socket)
        try:
            await terminal.send({"type": "hello", "conversation": "attach", "last_seq": None})
            assert (await terminal.next())["type"] == "welcome"
            again = await terminal.next()
            assert {**again, "seq": asked["seq"]} == asked  # the same request, unnumbered
            await terminal.send({"type": "approve", "id": asked["id"], "allow": True})
            after = await ws_until(ws, "idle")
        finally:
            await terminal.close()
    (result,) = _of(after, "tool_end")
    assert OUTPUT in result["result"]


async def test_the_remote_client_asks_its_approver_and_sends_the_answer():
    asked: list[tuple[str, str]] = []
    seen: list[Outbound] = []

    async def person_types_y(tool: str, command: str, confined: bool) -> str | None:
        asked.append((tool, command))
        return None

    async def deliver(item: Outbound) -> None:
        seen.append(item)

    async with _serve() as serve:
        path = Path(serve.info.socket)
        remote = connect_remote(path, "terminal", deliver, "tty", approve=person_types_y)
        async with remote as conn:
            await conn.send("run it", "tty")
            await asyncio.wait_for(conn.settle(), 30)
    assert asked == [("bash", COMMAND)]
    ends = [i.approval for i in seen if getattr(i, "kind", "") == "approval_end"]
    assert [(a.allowed, a.by) for a in ends if a is not None] == [(True, conn.chat_id)]
    results = [i.result for i in seen if getattr(i, "kind", "") == "tool_end"]
    assert [r is not None and OUTPUT in r.content for r in results] == [True]


async def test_new_while_an_approval_waits_declines_it():
    async with _serve() as serve, ws_client(serve) as ws:
        await ws_hello(ws, "fresh")
        await _send(ws, {"type": "send", "text": "run it"})
        await ws_until(ws, "approval")
        await _send(ws, {"type": "command", "text": "/new"})
        seen = await ws_until(ws, "approval_end")
        seen += await ws_until(ws, "idle")
    assert [(e["allowed"], e["reason"]) for e in _of(seen, "approval_end")] == [(False, "stopped")]
    assert [e["interrupted"] for e in _of(seen, "turn_end")] == [True]


async def test_shutdown_while_an_approval_waits_declines_it_before_the_serve_says_stopped():
    async with _serve() as serve, ws_client(serve) as ws:
        await ws_hello(ws, "down")
        await _send(ws, {"type": "send", "text": "run it"})
        await ws_until(ws, "approval")
        serve.stop.set()
        seen = await ws_until(ws, "error")
    assert [e["reason"] for e in _of(seen, "approval_end")] == ["stopped"]
    assert seen[-1]["code"] == "serve_stopped"
    kinds = [e["type"] for e in seen]
    assert kinds.index("approval_end") < kinds.index("turn_end")


async def test_heron_run_through_the_serve_says_the_command_waits_and_another_client_answers():
    out, err = StringIO(), StringIO()
    async with _serve() as serve, ws_client(serve) as ws:
        await ws_hello(ws, "script")
        run = asyncio.create_task(
            run_message(Settings.load, "run it", "default", "script", None, False, out, err)
        )
        asked = (await ws_until(ws, "approval"))[-1]
        await _send(ws, {"type": "approve", "id": asked["id"], "allow": True})
        assert await asyncio.wait_for(run, 30)
    said = f"the agent wants to run (bash, unconfined):\n{COMMAND}\n↑ the whole command (bash, "
    assert said in err.getvalue()  # the command on a line of its own, the question after it
    assert "allowed in the browser" in err.getvalue()  # not by its internal id (QA22t #5)
    assert f"Result: {OUTPUT}" in out.getvalue()


def _two_commands(request: ChatRequest) -> Reply:
    """Runs two commands in one reply (they may run at once), then says both results."""
    results = [p.content for m in request.messages for p in m.parts if isinstance(p, ToolResult)]
    if results:
        return Reply([Text(" | ".join(results))], "done", Usage(10, 2))
    calls = [ToolCall(f"c{n}", "bash", {"command": f"echo ran-{n}"}) for n in (1, 2)]
    return Reply(list(calls), "tool_use", Usage(10, 2))


async def test_a_chat_through_the_serve_asks_each_command_of_a_reply_on_its_own_line():
    out = StringIO()
    view = TerminalView(Console(file=out, width=200), ChatState("two", "default"))

    async def person() -> None:  # reads each command as it is shown, answers y to ran-1 only
        for _ in range(2):
            while view.asking is None or view.asking.done():
                await asyncio.sleep(0.01)
            shown = out.getvalue().rstrip().splitlines()[-2]  # the command, above the question
            view.answer("y" if shown == "echo ran-1" else "n")

    provider = ScriptedProvider(_two_commands)
    async with running_serve(provider) as serve:
        path = Path(serve.info.socket)
        remote = connect_remote(path, "terminal", view.deliver, "two", approve=view.approve)
        async with remote as conn:
            view.chat_id = conn.chat_id or ""
            answering = asyncio.create_task(person())
            await conn.send("run both", "two")
            await asyncio.wait_for(conn.settle(), 30)
            await asyncio.wait_for(answering, 30)
    assert out.getvalue().count("The agent wants to run (bash, unconfined):") == 2
    results = [p for m in provider.requests[-1].messages for p in m.tool_results]
    by_call = {r.call_id: r.content for r in results}
    assert "ran-1" in by_call["c1"] and DECLINED in by_call["c2"]  # each answer counted


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed")
async def test_an_approval_of_a_sandboxed_command_says_sandboxed_to_every_client(monkeypatch):
    """QA20m #3: with `approval = "ask"` and the sandbox working, the command runs confined, so
    the `approval` event says so (`confined`) and the chat and `heron run` word it
    "sandboxed", not "unconfined"."""
    monkeypatch.delenv("HERON_BWRAP")
    Settings.load().paths.ensure().config.write_text('[tools]\napproval = "ask"\n')
    out, err = StringIO(), StringIO()
    view = TerminalView(Console(file=out, width=200), ChatState("boxed", "default"))

    async def person() -> None:
        while view.asking is None or view.asking.done():
            await asyncio.sleep(0.01)
        view.answer("y")

    async with _serve() as serve, ws_client(serve) as ws:
        await ws_hello(ws, "boxed")
        remote = connect_remote(
            Path(serve.info.socket), "terminal", view.deliver, "boxed", approve=view.approve
        )
        async with remote as conn:
            view.chat_id = conn.chat_id or ""
            answering = asyncio.create_task(person())
            run = asyncio.create_task(
                run_message(Settings.load, "run it", "default", "boxed", None, False, out, err)
            )
            asked = (await ws_until(ws, "approval"))[-1]
            await asyncio.wait_for(answering, 30)
            assert await asyncio.wait_for(run, 30)
    assert asked["confined"] is True
    assert "The agent wants to run (bash, sandboxed):" in out.getvalue()
    said = f"the agent wants to run (bash, sandboxed):\n{COMMAND}\n↑ the whole command (bash, "
    assert said in err.getvalue()  # the command on a line of its own, the question after it
    assert "unconfined" not in out.getvalue() + err.getvalue()
