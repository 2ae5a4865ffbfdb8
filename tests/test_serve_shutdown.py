"""A real `heron serve` stopped by SIGTERM while a turn runs and follow-ups wait: mail in the
turn's mailbox and a message queued behind it (one with a file never joins a running turn). The
serve starts no turn for them (the fake model gets no other request), keeps them in the
conversation as the person's message with no answer yet, tells each client that sent one so,
and `heron run --retry -c KEY` then answers them. From `heron run` (its stderr and exit code)
and from a WebSocket client (the browser's protocol). The loop's side:
tests/test_loop_shutdown.py."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import httpx
import pytest
from serve_helpers import ServeProcess, clean_env, log_in
from waiting import until
from websockets.asyncio.client import connect

from heron.config import Settings
from heron.serve.auth import COOKIE
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # real processes

WAIT = 60.0


def _env(model: FakeOpenAIServer) -> dict[str, str]:
    return {"HERON_BASE_URL": model.base_url, "HERON_API_KEY": "d", "HERON_MODEL": "fake-model"}


async def _run(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heron", "run", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _said(proc: asyncio.subprocess.Process, words: str) -> list[str]:
    """stderr's lines up to the one holding `words`."""
    assert proc.stderr is not None
    lines = []
    while not lines or words not in lines[-1]:
        line = await asyncio.wait_for(proc.stderr.readline(), WAIT)
        assert line, f"heron run ended without saying {words!r}: {lines}"
        lines.append(line.decode())
    return lines


def _rows() -> list:
    store = Store(Settings.load().paths.db)
    try:
        conversation = store.conversation("personal")
        running = store.query("SELECT COUNT(*) FROM turns WHERE status = 'running'")[0][0]
        return [running, store.branch(conversation.id)]
    finally:
        store.close()


def _sigterm(serve: ServeProcess) -> int:
    assert serve.proc is not None
    serve.proc.send_signal(signal.SIGTERM)
    return serve.proc.wait(WAIT)


async def test_sigterm_keeps_heron_runs_mailed_and_queued_messages_and_retry_answers_them(
    heron_home,
):
    script = [ServerReply(hang=True), ServerReply(text="Answered: both follow-ups.")]
    notes = heron_home / "notes.txt"
    notes.write_text("line one\n")
    with FakeOpenAIServer(script) as model:
        env = clean_env(heron_home, _env(model))
        with ServeProcess(heron_home, _env(model)) as serve:
            first = await _run(env, "-c", "personal", "turn seven")
            await until(lambda: len(model.requests) == 1, WAIT)
            mailed = await _run(env, "-c", "personal", "mail seven")
            await _said(mailed, "went to the running turn")
            queued = await _run(env, "-c", "personal", "-a", str(notes), "queued eight")
            await _said(queued, "waits for the running turn")
            code = await asyncio.to_thread(_sigterm, serve)
            outs = [await asyncio.wait_for(p.communicate(), WAIT) for p in (first, mailed, queued)]
        requests = len(model.requests)
        running, rows = _rows()
        retry = await _run(env, "--retry", "-c", "personal")
        answered, retry_err = await asyncio.wait_for(retry.communicate(), WAIT)
    assert code == 0
    assert requests == 1  # no turn was started for the mail or the queued message
    assert running == 0  # nothing left running for the next process to close
    last = rows[-1]
    assert last.role == "user" and last.message.text.startswith("mail seven\n\nqueued eight")
    assert "line one" in last.message.text
    assert "turn seven" in rows[0].message.text and rows[1].meta.get("interrupted")
    assert first.returncode == 1 and "heron serve stopped" in outs[0][1].decode()
    for proc, (_, err) in zip((mailed, queued), outs[1:], strict=True):
        said = err.decode()
        assert proc.returncode == 1, said
        assert "heron serve stopped before your message was answered" in said
        assert "kept in conversation 'personal'" in said and "--retry -c personal" in said
        assert "the turn failed" not in said
    assert retry.returncode == 0, retry_err.decode()
    assert answered.decode() == "Answered: both follow-ups.\n"
    sent = json.dumps(model.requests[-1]["messages"])
    assert "mail seven" in sent and "queued eight" in sent


async def test_sigterm_keeps_a_browsers_mailed_and_queued_messages_and_tells_that_tab(heron_home):
    script = [ServerReply(hang=True)]
    with FakeOpenAIServer(script) as model:
        env = clean_env(heron_home, _env(model))
        with ServeProcess(heron_home, _env(model)) as serve:
            token = await log_in(serve.login)
            url = serve.login.split("/login")[0]
            cookie = {"Cookie": f"{COOKIE}={token}"}
            first = await _run(env, "-c", "personal", "turn nine")
            await until(lambda: len(model.requests) == 1, WAIT)
            ws_url = url.replace("http://", "ws://") + "/ws"
            async with connect(ws_url, origin=url, additional_headers=cookie) as ws:
                hello = {"type": "hello", "conversation": "personal", "last_seq": None}
                await ws.send(json.dumps(hello))
                await ws.send(json.dumps({"type": "send", "text": "tab mail nine"}))
                async with httpx.AsyncClient(base_url=url, cookies={COOKIE: token}) as http:
                    sent = await http.post(
                        "/api/uploads?name=red.txt",
                        content=b"red",
                        headers={"content-type": "text/plain"},
                    )
                upload = sent.json()
                ref = {k: upload[k] for k in ("upload_id", "name", "mime")}
                await ws.send(
                    json.dumps({"type": "send", "text": "tab queued nine", "files": [ref]})
                )
                events = []
                while sum(e.get("state") in ("mail", "queued") for e in events) < 2:
                    events.append(json.loads(await asyncio.wait_for(ws.recv(), WAIT)))
                code = await asyncio.to_thread(_sigterm, serve)
                while events[-1].get("code") != "serve_stopped":
                    events.append(json.loads(await asyncio.wait_for(ws.recv(), WAIT)))
            await asyncio.wait_for(first.communicate(), WAIT)
        requests = len(model.requests)
        running, rows = _rows()
    assert code == 0 and requests == 1 and running == 0
    told = [e for e in events if e["type"] == "message" and e.get("code") == "unanswered"]
    mine = {e["chat_id"] for e in events if e["type"] == "welcome"}
    assert len(told) == 2 and {e["chat_id"] for e in told} == mine
    assert all("kept in conversation 'personal'" in e["text"] for e in told)
    ends = [e for e in events if e["type"] == "turn_end"]
    # Told "keeping" before the turn's end (the tab keeps waiting), "kept" once it is written,
    # which is after the stopped turn (under its lease).
    keeping = [e for e in events if e["type"] == "message" and e.get("code") == "keeping"]
    assert {e["chat_id"] for e in keeping} == mine and "kept in" not in keeping[0]["text"]
    assert events.index(keeping[-1]) < events.index(ends[0]) < events.index(told[0])
    assert len(ends) == 1 and ends[0]["error"] == "heron serve stopped"
    last = rows[-1]
    assert last.role == "user" and last.message.text.startswith("tab mail nine\n\ntab queued nine")
