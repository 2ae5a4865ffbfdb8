"""The browser UI in headless Chromium (Playwright) against a real uvicorn on 127.0.0.1 and a
model the test steers: send, streaming, stop mid-tool, reload mid-stream without loss or
repeats, branches, memory review, upload."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from web_harness import SteeredModel, chromium, control_send, serve

from heron.messages import ToolCall

pytestmark = pytest.mark.slow

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - the dev extra installs it
    pytest.skip("playwright is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def model() -> SteeredModel:
    return SteeredModel()


@pytest.fixture
def site(model: SteeredModel) -> Iterator[Any]:
    with serve(model) as served:
        yield served


@pytest.fixture
def page(browser: Any, site: Any) -> Iterator[Any]:
    context = browser.new_context()
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(site.url + "/")
    expect(pg.get_by_role("textbox", name="message")).to_be_visible()
    yield pg
    context.close()
    assert not errors, errors


def _send(page: Any, text: str) -> None:
    box = page.get_by_role("textbox", name="message")
    box.fill(text)
    box.press("Enter")


def test_send_streams_the_reply_then_shows_it_from_the_store(page, model):
    _send(page, "hello there")
    log = page.get_by_role("log", name="transcript")
    expect(log.get_by_text("hello there")).to_be_visible()
    expect(page.get_by_role("status").filter(has_text="Agent is working")).to_be_visible()
    model.feed(("thinking", "Greet back."), ("text", "Hello, "))
    expect(log.locator(".live")).to_contain_text("Hello,")
    reasoning = log.locator("details.reasoning").first
    expect(reasoning).not_to_have_attribute("open", "")  # collapsed by default
    model.feed(("text", "**friend**."), ("end", None))
    expect(log.locator(".msg.assistant:not(.live) strong")).to_have_text("friend")
    expect(log.locator(".live")).to_have_count(0)  # now the stored transcript
    expect(page.get_by_text("Agent is working")).to_have_count(0)
    page.reload()
    expect(page.locator(".msg.assistant:not(.live) strong")).to_have_text("friend")
    expect(page.locator(".msg.user")).to_have_count(1)


def test_shift_enter_makes_a_new_line_and_enter_sends(page, model):
    box = page.get_by_role("textbox", name="message")
    box.fill("line one")
    box.press("Shift+Enter")
    box.type("line two")
    assert box.input_value() == "line one\nline two"
    box.press("Enter")
    expect(page.locator(".msg.user .user-text")).to_have_text("line one\nline two")
    model.reply("ok")
    expect(page.locator(".msg.assistant:not(.live)")).to_have_text("ok")


def test_stop_mid_tool_keeps_what_was_shown(browser, model):
    with serve(model) as site:
        pg = browser.new_page()
        pg.goto(site.url + "/")
        _send(pg, "run the slow tool")
        model.feed(
            ("text", "Starting."),
            ("call", ToolCall("c1", "bash", {"command": "sleep 30"})),
            ("end", None),
        )
        pill = pg.locator("details.pill")
        expect(pill).to_have_count(1)
        expect(pill).to_contain_text("bash")
        pg.keyboard.press("Escape")
        expect(pg.get_by_text("Agent is working")).to_have_count(0)
        expect(pg.locator(".msg.assistant:not(.live)").first).to_contain_text("Starting.")
        pg.reload()
        expect(pg.locator(".msg.assistant:not(.live)").first).to_contain_text("Starting.")
        pg.close()


def test_reload_mid_stream_resumes_without_loss_or_repeats(page, model):
    _send(page, "tell a story")
    model.feed(("text", "Once upon "))
    expect(page.locator(".live")).to_contain_text("Once upon")
    page.reload()
    expect(page.locator(".live")).to_contain_text("Once upon")
    model.feed(("text", "a time."), ("end", None))
    expect(page.locator(".msg.assistant:not(.live)")).to_have_text("Once upon a time.")
    text = page.locator(".messages").inner_text()
    assert text.count("Once upon") == 1 and text.count("tell a story") == 1


def test_a_message_sent_while_working_is_shown_as_mail(page, model):
    _send(page, "first")
    model.feed(("text", "Working on it"))
    expect(page.locator(".live")).to_contain_text("Working on it")
    _send(page, "also this")
    expect(page.locator(".msg.mail")).to_contain_text("also this")
    model.feed(("end", None))
    model.reply("Done with both.")
    expect(page.locator(".msg.assistant:not(.live)").last).to_contain_text("Done with both.")
    expect(page.locator(".live")).to_have_count(0)
    stored = page.locator(".msg.mail[data-id]")  # from the store: labelled mail there too
    expect(stored).to_contain_text("also this")
    expect(stored.locator(".mail-tag")).to_have_text("sent while the agent worked")


def test_markdown_is_sanitised(page, model):
    _send(page, "show html")
    model.reply('Hi <img src=x onerror="window.pwned=1"><script>window.pwned=2</script> **b**')
    expect(page.locator(".msg.assistant:not(.live) strong")).to_have_text("b")
    assert page.evaluate("window.pwned") is None
    assert page.locator(".msg.assistant script").count() == 0
    assert page.locator(".msg.assistant img[onerror]").count() == 0


def test_retry_makes_a_branch_and_switching_goes_back(page, model):
    _send(page, "pick a number")
    model.reply("seven")
    expect(page.locator(".msg.assistant:not(.live)")).to_have_text("seven")
    page.get_by_role("button", name="branches").click()
    panel = page.get_by_role("complementary", name="branches")
    panel.get_by_role("button", name="Retry the last message").click()
    model.reply("three")
    expect(page.locator(".msg.assistant:not(.live)")).to_have_text("three")
    expect(panel.get_by_role("button", name=re.compile("switch to branch"))).to_have_count(2)
    panel.get_by_role("button", name="switch to branch 1").click()
    expect(page.locator(".msg.assistant:not(.live)")).to_have_text("seven")


def test_edit_an_earlier_message_answers_it_on_a_new_branch(page, model):
    _send(page, "what is 2+2")
    model.reply("4")
    expect(page.locator(".msg.assistant:not(.live)")).to_have_text("4")
    page.on("dialog", lambda d: d.accept("what is 3+3"))
    page.locator(".msg.user").hover()
    page.get_by_role("button", name="edit this message").click()
    model.reply("6")
    expect(page.locator(".msg.assistant:not(.live)")).to_have_text("6")
    expect(page.locator(".msg.user:not(.live-user) .user-text")).to_have_text("what is 3+3")


def test_memory_review_as_a_checklist(page, model):
    from heron.config import Settings
    from heron.memory.entries import EntryPath
    from heron.memory.service import MemoryService
    from heron.store import Store

    _send(page, "I prefer tea, I live in Lyon")
    model.reply("Noted.")
    expect(page.locator(".msg.assistant:not(.live)")).to_have_text("Noted.")
    settings = Settings.load()
    store = Store(settings.paths.db)
    service = MemoryService(settings.paths.memory, store)
    conv = store.conversation("personal")
    keep = service.suggest_fact(conv.id, EntryPath.parse("user/always/tea.md"), "I prefer tea")
    drop = service.suggest_fact(conv.id, EntryPath.parse("user/always/home.md"), "I live in Lyon")
    page.get_by_role("button", name="review").click()
    panel = page.get_by_role("complementary", name="review")
    panel.locator(f"input[data-id='{keep}']").check()
    panel.get_by_role("button", name="Keep checked, drop the rest").click()
    expect(panel.get_by_text("Nothing waits for review.")).to_be_visible()
    assert service.waiting() == []
    assert [e.path.rel for e in service.entries()] == ["user/always/tea.md"]
    assert drop is not None
    page.get_by_role("button", name="memory", exact=True).click()
    mem = page.get_by_role("complementary", name="memory")
    expect(mem.locator(".quote")).to_contain_text("I prefer tea")


def test_upload_by_file_picker(page, model, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("some notes")
    page.locator("input[type=file]").set_input_files(str(f))
    expect(page.get_by_role("list", name="attachments")).to_contain_text("notes.txt")
    from heron.config import Settings

    uploads = list((Settings.load().paths.home / "uploads").glob("*.bin"))
    assert [u.read_text() for u in uploads] == ["some notes"]


def test_a_message_from_the_terminal_client_appears_in_the_open_page(page, site, model):
    """`heron chat` on the same home talks to the serve over its control socket: the page
    attached to `personal` sees the message and its reply as they stream."""
    import threading

    got: list[list[dict]] = []
    client = threading.Thread(target=lambda: got.append(control_send(site, "from the terminal")))
    client.start()
    expect(page.locator(".msg.user").filter(has_text="from the terminal")).to_be_visible()
    model.feed(("text", "Answered "))
    expect(page.locator(".live")).to_contain_text("Answered")
    model.feed(("text", "in both."), ("end", None))
    expect(page.locator(".msg.assistant:not(.live)")).to_have_text("Answered in both.")
    client.join(30)
    deltas = "".join(e.get("text", "") for e in got[0] if e["type"] == "delta")
    assert deltas == "Answered in both."
