"""Screenshots of the web UI's main views for docs/web.md, taken in headless Chromium against a
real `heron serve` on a temporary home, with a model the script steers.

    .venv/bin/python scripts/web_screenshots.py   # writes docs/web/*.png
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "web"
sys.path.insert(0, str(ROOT / "tests"))


def _send(page, text: str) -> None:
    box = page.get_by_role("textbox", name="message")
    box.fill(text)
    box.press("Enter")


def _stored(page, count: int) -> None:
    page.locator(".msg.assistant:not(.live)").nth(count - 1).wait_for()
    page.locator(".live").wait_for(state="detached")


def seed_memory() -> None:
    from heron.config import Settings
    from heron.memory.entries import EntryPath
    from heron.memory.service import MemoryService
    from heron.store import Store

    settings = Settings.load()
    store = Store(settings.paths.db)
    conv = store.conversation("personal")
    service = MemoryService(settings.paths.memory, store)
    service.save(
        conv.id,
        EntryPath.parse("user/always/home.md"),
        "I live in Lyon",
        conversation_key="personal",
    )
    service.suggest_fact(conv.id, EntryPath.parse("user/always/tea.md"), "I prefer green tea")
    service.suggest_fact(
        conv.id, EntryPath.parse("user/when/travel/train.md"), "I take the train to Paris"
    )
    store.close()


def approval(browser, home: Path) -> None:
    """A command waiting for approval, on a home where commands cannot be confined."""
    from web_harness import SteeredModel, serve

    from heron.messages import ToolCall

    os.environ.update(HERON_HOME=str(home), HERON_BWRAP="off")
    model = SteeredModel()
    try:
        with serve(model) as site:
            context = site.context(browser, viewport={"width": 1280, "height": 560})
            page = context.new_page()
            page.goto(site.url + "/")
            _send(page, "Free some disk space in the workspace.")
            command = "du -sh build/ && rm -rf build/"
            model.feed(
                ("text", "The build folder is the largest; I will remove it."),
                ("call", ToolCall("c1", "bash", {"command": command})),
                ("end", None),
            )
            page.get_by_role("button", name="Allow").wait_for()
            page.screenshot(path=str(OUT / "approval.png"))
            page.get_by_role("button", name="Deny").click()
            model.reply("Left as it is.")
            _stored(page, 1)
            context.close()
    finally:
        del os.environ["HERON_BWRAP"]


def main() -> int:
    from web_harness import SteeredModel, chromium, serve

    from heron.messages import ToolCall

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HERON_HOME"] = str(Path(tmp) / "home")
        model = SteeredModel()
        with serve(model) as site, chromium() as browser:
            context = site.context(browser, viewport={"width": 1280, "height": 800})
            page = context.new_page()
            page.goto(site.url + "/")
            _send(page, "I live in Lyon, I prefer green tea, I take the train to Paris")
            model.reply("Noted. Ask me anything about your trips.")
            _stored(page, 1)
            _send(page, "What is 6 times 7? Check it in the shell, and show me the Python.")
            model.feed(
                ("thinking", "Arithmetic in the shell, then the same in Python."),
                ("text", "Let me check."),
                ("call", ToolCall("c1", "bash", {"command": "echo $((6 * 7))"})),
                ("end", None),
            )
            model.feed(
                ("text", "It is **42**. In Python:\n\n```python\n"),
                ("text", "print(6 * 7)  # 42\n```\n"),
                ("end", None),
            )
            _stored(page, 2)
            page.locator("details.pill").first.click()
            page.screenshot(path=str(OUT / "chat.png"))

            _send(page, "And where do herons live?")
            model.feed(("thinking", "Habitats."), ("text", "Herons live near water: "))
            page.locator(".live").get_by_text("Herons live near water").wait_for()
            page.get_by_text("Agent is working").wait_for()
            page.screenshot(path=str(OUT / "streaming.png"))
            model.feed(("text", "marshes, rivers and coasts."), ("end", None))
            _stored(page, 3)

            seed_memory()
            for view in ("memory", "review", "branches", "status", "compaction"):
                page.get_by_role("button", name=view, exact=True).click()
                page.get_by_role("complementary", name=view).locator("h2").wait_for()
                page.screenshot(path=str(OUT / f"{view}.png"))
            page.get_by_role("button", name="close panel").click()

            phone = site.context(browser, viewport={"width": 390, "height": 760})
            small = phone.new_page()
            small.goto(site.url + "/")
            small.locator(".msg.assistant").nth(2).wait_for()
            small.locator("pre code .shj-syn-num").first.wait_for()  # highlighted (async)
            small.screenshot(path=str(OUT / "phone.png"))
            phone.close()
            context.close()
            approval(browser, Path(tmp) / "unconfined")
    for png in sorted(OUT.glob("*.png")):
        print(png.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
