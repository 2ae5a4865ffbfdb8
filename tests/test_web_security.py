"""The web UI's security, end to end against the real `heron serve`: a page of another origin
cannot open /ws, a non-loopback bind needs the one-time login (then the page works with its
cookie), every response carries the CSP, the UI runs under it with no inline script and no CSP
violation, and DOMPurify strips a script from a model's reply."""

from __future__ import annotations

import http.server
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from web_harness import SteeredModel, chromium, serve

pytestmark = pytest.mark.slow

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover
    pytest.skip("playwright is not installed", allow_module_level=True)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data: blob:; connect-src 'self'"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_every_file_and_route_carries_the_csp_and_the_page_has_no_inline_script():
    with serve(SteeredModel()) as site:
        for path in ("/", "/app.js", "/style.css", "/vendor/purify.js", "/api/conversations"):
            status, headers, _ = _get(site.url + path)
            assert status == 200, path
            assert headers["content-security-policy"] == CSP, path
            assert headers["x-content-type-options"] == "nosniff", path
        _, _, page = _get(site.url + "/")
        for script in re.findall(rb"<script\b([^>]*)>(.*?)</script>", page, re.S):
            assert b"src=" in script[0] and script[1].strip() == b""
        assert not re.search(rb"\son[a-z]+\s*=", page)  # no inline event handlers


def test_the_ui_runs_under_the_csp_without_a_violation(browser):
    model = SteeredModel()
    with serve(model) as site:
        pg = browser.new_page()
        violations: list[str] = []
        pg.on("console", lambda m: violations.append(m.text) if "Content Security" in m.text else 0)
        pg.goto(site.url + "/")
        box = pg.get_by_role("textbox", name="message")
        box.fill("show code")
        box.press("Enter")
        model.reply("```py\nprint('hi')\n```")
        expect(pg.locator(".msg.assistant:not(.live) pre code")).to_contain_text("print")
        assert violations == []
        pg.close()


def test_a_script_in_a_reply_is_stripped(browser):
    model = SteeredModel()
    with serve(model) as site:
        pg = browser.new_page()
        pg.goto(site.url + "/")
        box = pg.get_by_role("textbox", name="message")
        box.fill("hi")
        box.press("Enter")
        model.reply(
            'Look <script>window.owned=1</script><img src=x onerror="window.owned=2">'
            '<a href="javascript:window.owned=3">link</a> **done**'
        )
        reply = pg.locator(".msg.assistant:not(.live)")
        expect(reply.locator("strong")).to_have_text("done")
        assert reply.locator("script").count() == 0
        assert reply.locator("[onerror]").count() == 0
        assert "javascript:" not in (reply.locator("a").first.get_attribute("href") or "")
        assert pg.evaluate("window.owned") is None
        pg.close()


class _Elsewhere(http.server.BaseHTTPRequestHandler):
    """Another site: a blank page on another port of 127.0.0.1."""

    def do_GET(self) -> None:
        body = b"<!doctype html><title>elsewhere</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


_OPEN = """url => new Promise(done => {
  const ws = new WebSocket(url);
  ws.onopen = () => done("open");
  ws.onerror = () => done("refused");
})"""


def test_a_page_of_another_origin_cannot_open_the_socket(browser):
    elsewhere = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Elsewhere)
    threading.Thread(target=elsewhere.serve_forever, daemon=True).start()
    try:
        with serve(SteeredModel()) as site:
            ws_url = site.url.replace("http://", "ws://") + "/ws"
            pg = browser.new_page()
            pg.goto(f"http://127.0.0.1:{elsewhere.server_address[1]}/")
            assert pg.evaluate(_OPEN, ws_url) == "refused"
            pg.goto(site.url + "/")  # the UI's own page opens it
            assert pg.evaluate(_OPEN, ws_url) == "open"
            pg.close()
    finally:
        elsewhere.shutdown()


def test_off_loopback_the_page_needs_the_one_time_login(browser):
    model = SteeredModel()
    with serve(model, force_auth=True) as site:
        status, _, body = _get(site.url + "/")
        assert status == 401 and b"/login?code=" in body
        assert _get(site.url + "/api/conversations")[0] == 401
        context = browser.new_context()
        pg = context.new_page()
        pg.goto(site.url + "/")
        expect(pg.locator("body")).to_contain_text("Log in first")
        login = site.auth.login_url(site.url)
        assert login is not None
        pg.goto(login)  # sets the HttpOnly, SameSite=Strict cookie and redirects to /
        cookie = next(c for c in context.cookies() if c["name"] == "heron_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
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
        expect(pg2.locator("body")).to_contain_text("wrong or already used")
        other.close()
        context.close()
