"""A real `heron serve` subprocess killed mid-turn and started again under an open page: the
page says the connection is down (not "Agent is working" counting on) and keeps a message typed
meanwhile in the box; once the new serve answers, the page takes its numbering (the hub's
`instance`, docs/web.md): the turn the restart ended is no longer shown as running, a question
asked after the restart is shown and answered from the page, and every message and reply after
it appears."""

from __future__ import annotations

import re
import signal
import socket
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from serve_helpers import ServeProcess
from web_harness import chromium, control_send, log_in, logged_in

from heron.serve.lock import SOCKET_NAME
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # real processes and a browser

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - the dev extra installs it
    pytest.skip("playwright is not installed", allow_module_level=True)

QUESTION = "Did you see this question?"


def _said(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content).partition("[Runtime")[0].strip()


def _model(body: dict[str, Any]) -> ServerReply:
    """Echoes the person; "STALL" streams a little and then nothing until the serve goes away;
    "ASK" calls ask_user, whose answer it then repeats."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return ServerReply(text=f"Tool said: {_said(last)}")
    said = _said(last)
    if said.startswith("STALL"):
        return ServerReply(text="Thinking about it for a long time", stall_after_events=2)
    if said.startswith("ASK"):
        return ServerReply(tool_calls=[("ask_user", {"question": QUESTION})])
    return ServerReply(text=f"echo: {said.splitlines()[-1]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _send(page: Any, text: str) -> None:
    box = page.get_by_role("textbox", name="message")
    box.fill(text)
    box.press("Enter")


def test_a_page_open_across_a_serve_restart_shows_everything_after_it(heron_home):
    port = _free_port()
    with FakeOpenAIServer(_model) as fake, chromium() as browser:
        env = {"HERON_BASE_URL": fake.base_url, "HERON_API_KEY": "dummy", "HERON_MODEL": "fake"}
        first = ServeProcess(heron_home, env, port).__enter__()
        try:
            url = re.search(r"http://\S+", first.banner).group(0).rstrip("/")
            context = logged_in(browser, url, log_in(first.login))
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url + "/")
            replies = page.locator(".msg.assistant:not(.live)")
            for n in range(4):  # the first serve's numbering goes past what the next sends
                _send(page, f"hello {n}")
                expect(replies.last).to_contain_text(f"echo: hello {n}")
            _send(page, "STALL while it restarts")
            banner = page.get_by_role("status").filter(has_text="Agent is working")
            expect(banner).to_have_count(1)
            # Killed outright: the page hears no end of the turn, which the new serve never
            # runs on (SIGTERM would stop it first and tell the page).
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(60)
        finally:
            first.__exit__(None, None, None)
        expect(page.get_by_role("status", name="connection closed")).to_have_count(1)
        expect(page.locator(".banner")).to_contain_text("No connection to heron serve")
        expect(page.locator(".banner")).not_to_contain_text("Agent is working")
        _send(page, "typed while it was down")
        expect(page.get_by_role("alert")).to_contain_text("Not sent")
        box = page.get_by_role("textbox", name="message")
        expect(box).to_have_value("typed while it was down")
        box.fill("")
        with ServeProcess(heron_home, env, port):
            expect(page.get_by_role("status", name="connection open")).to_have_count(1)
            expect(page.locator(".banner")).to_have_count(0)  # the restart ended that turn
            served = SimpleNamespace(control=heron_home / SOCKET_NAME)
            ran: list[list[dict[str, Any]]] = []
            asker = threading.Thread(
                target=lambda: ran.append(control_send(served, "ASK me", channel="script"))
            )
            asker.start()
            card = page.get_by_role("note", name="the agent asks you")
            expect(card).to_contain_text(QUESTION)
            expect(card).to_contain_text("It waits up to 60 minutes for your answer.")
            expect(card).not_to_contain_text("Run ask_")
            expect(box).to_have_attribute("placeholder", re.compile("answers its question"))
            _send(page, "yes I saw it")
            asker.join(60)
            ends = [e for e in ran[0] if e["type"] == "turn_end"] if ran else []
            assert ends and ends[0]["ok"], ran
            expect(page.get_by_role("article", name="your answer")).to_contain_text("yes I saw it")
            expect(replies.last).to_contain_text("Tool said:")
            for n in range(2):
                _send(page, f"probe {n}")
                expect(replies.last).to_contain_text(f"echo: probe {n}")
            expect(page.get_by_text("probe 1", exact=True)).to_have_count(1)
        # Stopped cleanly while idle (SIGTERM) and started again: the same.
        expect(page.get_by_role("status", name="connection closed")).to_have_count(1)
        with ServeProcess(heron_home, env, port):
            expect(page.get_by_role("status", name="connection open")).to_have_count(1)
            _send(page, "probe after a clean restart")
            expect(replies.last).to_contain_text("echo: probe after a clean restart")
        context.close()
    assert not errors, errors
