"""The browser beside a turn another process runs on the serve's home (`heron run --model`):
the list marks the conversation, the banner says where the turn runs and that its reply shows
when it ends, and when it ends the reply shows, once, without a reload."""

from __future__ import annotations

import asyncio
import os
import re
import threading

import pytest
from test_web_ui import browser, model, page, site  # noqa: F401 (the page's fixtures)
from web_harness import SteeredModel

from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.bus import InboundMessage, MessageBus
from heron.config import Settings

pytestmark = pytest.mark.slow

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - the dev extra installs it
    pytest.skip("playwright is not installed", allow_module_level=True)
# The page opens `personal`, where the other process's turns run.


def _turn_elsewhere(provider: SteeredModel, text: str) -> threading.Thread:
    """A turn in `personal` run by another Engine on the same home (as `heron run --model`
    runs it beside the serve), on a thread of its own; it ends when `provider` is fed."""

    async def run() -> None:
        async with Engine.open(Settings.load(), provider=provider) as other:
            loop = AgentLoop(other, MessageBus())
            await loop.dispatch(InboundMessage("script", "c", text, "personal"))
            await asyncio.wait_for(loop.wait_idle(), 60)

    thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
    thread.start()
    return thread


def test_a_turn_of_another_process_shows_its_banner_then_its_reply_once(page):  # noqa: F811
    other = SteeredModel()
    thread = _turn_elsewhere(other, "asked from the other process")
    banner = page.get_by_role("status", name="a turn runs elsewhere")
    expect(banner).to_contain_text(f"A turn runs in process {os.getpid()}")
    expect(banner).to_contain_text("its reply shows when it ends")
    row = page.locator(".convs li").filter(has=page.locator("a[href='#c=personal']"))
    expect(row).to_have_class(re.compile(r"\brunning\b"))
    expect(row).to_contain_text("a turn is running")
    messages = page.locator(".messages")
    expect(messages).to_contain_text("asked from the other process")  # stored: shown at once
    other.reply("answered in the other process")
    thread.join(60)
    expect(messages).to_contain_text("answered in the other process")
    expect(banner).to_have_count(0)
    expect(page.locator(".convs li.running")).to_have_count(0)
    shown = str(messages.text_content())
    assert shown.count("answered in the other process") == 1
    assert shown.count("asked from the other process") == 1


def test_the_banners_stop_stops_the_turn_of_the_other_process(page):  # noqa: F811
    other = SteeredModel()
    thread = _turn_elsewhere(other, "a long one elsewhere")
    banner = page.get_by_role("status", name="a turn runs elsewhere")
    expect(banner).to_contain_text("its reply shows when it ends")
    other.feed(("text", "begun, "))  # streamed there, never here
    banner.get_by_role("button", name="stop that turn").click()
    thread.join(60)  # the other process's turn noticed the stop and ended
    assert not thread.is_alive()
    expect(banner).to_have_count(0)
    expect(page.locator(".messages")).to_contain_text(f"Stopped a turn in process {os.getpid()}")
