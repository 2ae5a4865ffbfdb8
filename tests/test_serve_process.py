"""A real `heron serve` subprocess against a fake OpenAI server: SIGTERM mid-tool stops the
turn as /stop does (the finished tool work and the reply so far kept) and exits 0; a second
serve on the home is refused naming the first."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
from serve_helpers import LineClient

from heron.config import Settings
from heron.messages import Text, ToolResult
from heron.serve.lock import INFO_NAME, SOCKET_NAME
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # real processes


def serve_process(home, url: str) -> subprocess.Popen[str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
    }
    env.update(
        HERON_HOME=str(home), HERON_BASE_URL=url, HERON_API_KEY="dummy", HERON_MODEL="fake-model"
    )
    return subprocess.Popen(
        [sys.executable, "-m", "heron", "serve", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


SCRIPT = [
    ServerReply(text="Working on it.", tool_calls=[("run_cell", {"code": "print('step one')"})]),
    ServerReply(tool_calls=[("run_cell", {"code": "import time; time.sleep(120)"})]),
]


async def test_sigterm_stops_the_running_turn_keeps_its_work_and_exits_0(heron_home):
    with FakeOpenAIServer(SCRIPT) as model:
        proc = serve_process(heron_home, model.base_url)
        try:
            first = await asyncio.to_thread(proc.stdout.readline)  # "heron serve: URL ..."
            assert first.startswith("heron serve: http://127.0.0.1:"), proc.stderr.read()
            second = serve_process(heron_home, model.base_url)
            refused = await asyncio.to_thread(second.communicate, timeout=60)
            assert second.returncode != 0 and f"pid {proc.pid}" in refused[1]
            client = await LineClient.open(heron_home / SOCKET_NAME)
            await client.send({"type": "hello", "conversation": "long", "last_seq": None})
            await client.send({"type": "send", "text": "run the long job"})
            starts = 0
            while starts < 2:
                starts += (await client.next())["type"] == "tool_start"
            proc.send_signal(signal.SIGTERM)
            events = await client.until("turn_end")
            await client.close()
            code = await asyncio.to_thread(proc.wait, 60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert code == 0
    assert events[-1]["interrupted"] is True
    assert not (heron_home / INFO_NAME).exists() and not (heron_home / SOCKET_NAME).exists()
    store = Store(Settings.load().paths.db)
    conversation = store.conversation("long")
    assert conversation is not None
    parts = [p for m in store.branch(conversation.id) for p in m.message.parts]
    store.close()
    assert any(isinstance(p, Text) and "Working on it." in p.text for p in parts)
    assert any(isinstance(p, ToolResult) and "step one" in p.content for p in parts)
