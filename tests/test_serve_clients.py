"""`heron run` (and chat's connection) as thin clients of a running serve: the same output as
in-process, busy conversations answered through the mailbox, no provider imported."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from io import StringIO

import pytest
from serve_helpers import ServeProcess, clean_env, running_serve, ws_client, ws_hello, ws_until

from heron.channels.script import run_message, run_once
from heron.config import Settings
from heron.messages import Reply, Text, ToolCall
from heron.providers.scripted import ScriptedProvider
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
from heron.tools.registry import ToolContext, ToolRegistry, tool


class _Watched(StringIO):
    """stderr that says when a word was written to it."""

    def __init__(self, word: str) -> None:
        super().__init__()
        self.word, self.seen = word, asyncio.Event()

    def write(self, text: str) -> int:
        if self.word in text:
            self.seen.set()
        return super().write(text)


def _echo(request) -> Reply:
    said = request.messages[-1].text.partition("[Runtime")[0].strip()
    return Reply([Text(f"echo: {said}")], "done")


async def test_heron_run_through_serve_prints_what_it_prints_in_process():
    through = (StringIO(), StringIO())
    async with running_serve(ScriptedProvider(_echo)) as serve:
        ok = await run_message(Settings.load, "hi there", "default", "k1", None, False, *through)
        served = serve.url
    alone = (StringIO(), StringIO())
    provider = ScriptedProvider(_echo)
    assert await run_once(
        Settings.load(), "hi there", "default", "k2", None, False, *alone, provider
    )
    assert ok and served
    assert through[0].getvalue() == alone[0].getvalue() == "echo: hi there\n"
    assert through[1].getvalue() == alone[1].getvalue()


async def test_heron_run_on_a_busy_conversation_says_so_and_is_answered_in_the_running_turn():
    gate = asyncio.Event()

    @tool
    async def wait_gate(ctx: ToolContext) -> str:
        """Wait until the test opens the gate."""
        await gate.wait()
        return "gate passed"

    seen: list[str] = []

    def script(request) -> Reply:
        said = [m.text for m in request.messages if m.role == "user"]
        seen.append(said[-1])
        if len(seen) == 1:
            return Reply([ToolCall("c1", "wait_gate", {})], "tool")
        return Reply([Text("answered both")], "done")

    out, err = StringIO(), _Watched("busy")
    registry = ToolRegistry([wait_gate])
    async with running_serve(ScriptedProvider(script), registry) as serve, ws_client(serve) as ws:
        await ws_hello(ws)
        await ws.send(json.dumps({"type": "send", "text": "start the job"}))
        await ws_until(ws, "tool_start")
        run = asyncio.create_task(
            run_message(Settings.load, "and this too", "default", "personal", None, False, out, err)
        )
        await asyncio.wait_for(err.seen.wait(), 30)
        assert not run.done()
        gate.set()
        assert await asyncio.wait_for(run, 30)
        browser = await ws_until(ws, "turn_end")
    assert "went to the running turn" in err.getvalue()
    assert out.getvalue() == "answered both\n"
    assert any("and this too" in m for m in seen)  # the mail reached the model in that turn
    assert browser[-1]["reply"] == "answered both"  # the browser saw the same turn end


@pytest.mark.slow
def test_a_run_through_serve_imports_no_provider_and_no_sdk(heron_home):
    with FakeOpenAIServer([ServerReply(text="light reply")]) as model:
        env = {"HERON_BASE_URL": model.base_url, "HERON_API_KEY": "d", "HERON_MODEL": "fake-model"}
        with ServeProcess(heron_home, env):
            run = subprocess.run(
                [sys.executable, "-X", "importtime", "-m", "heron", "run", "hello"],
                env=clean_env(heron_home, env),
                capture_output=True,
                text=True,
                timeout=120,
            )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "light reply\n"
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)", run.stderr, re.M))
    assert "heron.channels.remote" in imported  # it went through the serve
    heavy = {m for m in imported if m.split(".")[0] in ("openai", "anthropic", "xllamacpp")}
    heavy |= {
        m for m in imported if m.startswith(("heron.providers", "heron.agent", "heron.store"))
    }
    assert heavy == set()
