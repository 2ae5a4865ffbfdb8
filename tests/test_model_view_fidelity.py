"""The model view (`heron conversations show --model-view`, `--budget`, the browser's compaction
panel) is what the next request holds: its system prompt and tools are built by the engine that
sends it, not from the default tools with no memory (QA17e defect 4)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from serve_helpers import running_serve, ws_client, ws_hello, ws_until
from typer.testing import CliRunner

from heron.cli import app
from heron.config import Settings
from heron.messages import Reply, Text, Usage
from heron.providers.scripted import ScriptedProvider
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

UNITS = "I prefer metric units"


def remember_units() -> None:
    """A memory entry, so the prompt has a Memory section to show."""
    folder = Settings.load().paths.memory / "user" / "always"
    folder.mkdir(parents=True)
    (folder / "units.md").write_text(UNITS + "\n")


def shown(*args: str) -> str:
    out = CliRunner().invoke(app, ["conversations", "show", *args])
    assert out.exit_code == 0, out.output
    return out.output


def system_and_tools(output: str) -> tuple[str, str]:
    """The system prompt and the tools block `--model-view` printed."""
    system = output.split("── system\n", 1)[1].split("\n── tools (", 1)[0]
    tools = output.split("\n── tools (", 1)[1].split("\n", 1)[1].split("\n── user\n", 1)[0]
    return system, tools


def heron_run(key: str, text: str) -> None:
    """A one-shot `heron run` in-process, in a process of its own (as a person runs it)."""
    done = subprocess.run(
        [sys.executable, "-m", "heron", "run", "-c", key, text],
        env=dict(os.environ),
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def tool_lines(specs: list[tuple[str, str]]) -> str:
    return "\n".join(f"{name}: {description}" for name, description in specs)


def test_the_model_view_is_the_next_requests_system_prompt_and_tools(monkeypatch):
    """In-process: `heron run`, then the view, then the next `heron run`'s request: the view's
    system prompt and tools are the request's, byte for byte."""
    remember_units()
    with FakeOpenAIServer(lambda body: ServerReply(text="fine")) as server:
        monkeypatch.setenv("HERON_BASE_URL", server.base_url)
        monkeypatch.setenv("HERON_MODEL", "fake-model")
        monkeypatch.setenv("HERON_API_KEY", "dummy")
        heron_run("k", "hello")
        view = shown("k", "--model-view")
        budget = shown("k", "--budget")
        heron_run("k", "again")
        # the turn's own request (a one-shot run may make others: the review pass)
        sent = next(r for r in server.requests if "again" in json.dumps(r) and r.get("tools"))
    system, tools = system_and_tools(view)
    (first,) = [m for m in sent["messages"] if m["role"] == "system"]
    assert system == first["content"]
    functions = [t["function"] for t in sent["tools"]]
    assert tools == tool_lines([(f["name"], f["description"]) for f in functions])
    assert f"── tools ({len(functions)}, sent before the system prompt)" in view
    # What the default registry with no memory lacked (the view used to show 10 tools).
    names = {f["name"] for f in functions}
    assert {"schedule", "spawn", "ask_user", "goal", "message", "manage_memory"} <= names
    assert UNITS in system and "# Recurring work" in system
    now = budget.split("\nNow:\n", 1)[1]  # what the parts take now (the budgets come first)
    memory = next(line for line in now.splitlines() if line.strip().startswith("memory"))
    assert int(memory.split()[-1].replace(",", "")) > 0


def test_a_look_does_not_freeze_the_memory_section(monkeypatch):
    """The view reads the Memory section as the next turn would freeze it, and does not
    freeze it: a memory saved after the look is in the next turn's prompt."""
    from heron.memory.records import snapshot
    from heron.store import Store

    with FakeOpenAIServer(lambda body: ServerReply(text="fine")) as server:
        monkeypatch.setenv("HERON_BASE_URL", server.base_url)
        monkeypatch.setenv("HERON_MODEL", "fake-model")
        monkeypatch.setenv("HERON_API_KEY", "dummy")
        store = Store(Settings.load().database)
        conv = store.open_conversation("fresh")
        remember_units()
        system, _ = system_and_tools(shown("fresh", "--model-view"))
        assert UNITS in system
        assert snapshot(store, conv.id) is None
        store.close()


async def test_the_serves_compaction_panel_and_the_cli_show_what_the_serve_sends():
    """With a serve up: its compaction panel (`GET .../compactions`) and the CLI's view give the
    system prompt and tools of the serve's next request."""
    remember_units()
    model = ScriptedProvider(
        [
            Reply([Text("first")], "done", Usage(10, 2)),
            Reply([Text("second")], "done", Usage(10, 2)),
        ]
    )
    async with running_serve(model) as serve, ws_client(serve) as ws:
        await ws_hello(ws, "k")
        await ws.send('{"type": "send", "text": "hello"}')
        await ws_until(ws, "idle")
        async with serve.http() as http:
            panel: dict[str, Any] = (await http.get("/api/conversations/k/compactions")).json()
        view = await asyncio.to_thread(shown, "k", "--model-view")
        await ws.send('{"type": "send", "text": "again"}')
        await ws_until(ws, "idle")
    sent = model.requests[1]
    assert panel["system"] == sent.system
    specs = [
        {"name": t.name, "description": t.description, "parameters": t.parameters}
        for t in sent.tools
    ]
    assert json.dumps(panel["tools"]) == json.dumps(specs)
    system, tools = system_and_tools(view)
    assert system == sent.system
    assert tools == tool_lines([(t.name, t.description) for t in sent.tools])
    assert UNITS in sent.system and len(sent.tools) > 10


@pytest.fixture(autouse=True)
def _no_embedded(monkeypatch):
    monkeypatch.setenv("HERON_NO_EMBEDDED", "1")  # never the offline model's brief prompt
