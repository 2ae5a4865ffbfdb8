"""A base URL that answers 200 with something that is not the OpenAI API (a web server's HTML
page, JSON of another shape): `heron models` crashed with a traceback, and a turn retried five
times and then said "the stream ended before the model finished", naming neither the address
nor the setting (QA22u M5, M6; the Anthropic wire: QA22v M4). Both now fail at once, saying
where and what to check."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from heron.errors import FatalProviderError
from heron.messages import user
from heron.providers.anthropic import AnthropicProvider
from heron.providers.openai_compat import OpenAICompatProvider
from heron.request import ChatRequest

HTML = b"<html><body><h1>Welcome to nginx!</h1></body></html>"


class _Page(ThreadingHTTPServer):
    body: bytes = HTML
    content_type = "text/html"
    hits = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Page

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _answer(self) -> None:
        self.server.hits += 1
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("content-type", self.server.content_type)
        self.send_header("content-length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    do_GET = do_POST = _answer


@pytest.fixture
def page() -> Iterator[_Page]:
    server = _Page(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def page_url(page: _Page) -> str:
    return f"http://127.0.0.1:{page.server_address[1]}/v1"


def _provider(page: _Page, wire: str = "openai") -> OpenAICompatProvider | AnthropicProvider:
    if wire == "anthropic":  # its base URL is the host: the SDK adds /v1
        url = page_url(page).removesuffix("/v1")
        return AnthropicProvider("x", "k", base_url=url, url_source="ANTHROPIC_BASE_URL")
    return OpenAICompatProvider("x", "k", base_url=page_url(page), url_source="HERON_BASE_URL")


SETTING = {"openai": "HERON_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("body", "content_type"),
    [(HTML, "text/html"), (b'{"hello": "world"}', "application/json"), (b"[1, 2]", "")],
)
async def test_a_model_list_that_is_not_one_is_said_with_the_address(
    page, body, content_type, wire
):
    page.body, page.content_type = body, content_type
    provider = _provider(page, wire)
    try:
        with pytest.raises(FatalProviderError) as raised:
            await provider.list_models(5)
    finally:
        await provider.aclose()
    assert raised.value.summary.startswith("its GET /models answered with")
    assert raised.value.summary.endswith("not a list of models")
    assert f"Check {SETTING[wire]}" in (raised.value.hint or "")


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/json"])
async def test_a_stream_that_is_no_event_stream_fails_at_once(page, content_type, wire):
    page.content_type = content_type
    provider = _provider(page, wire)
    try:
        with pytest.raises(FatalProviderError) as raised:  # fatal: never retried
            await provider.chat(ChatRequest("x", "", [user("hello")]))
    finally:
        await provider.aclose()
    kind = content_type.split(";")[0]
    assert raised.value.summary.endswith(
        f"({SETTING[wire]}) answered with {kind}, not an event stream"
    )
    assert "does not look like the model API" in (raised.value.hint or "")
    assert page.hits == 1


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_heron_models_says_it_in_two_lines_not_a_traceback(page, monkeypatch, wire):
    from typer.testing import CliRunner

    from heron.cli import app

    url = page_url(page)
    if wire == "anthropic":
        url = url.removesuffix("/v1")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "dummy")
        monkeypatch.setenv("HERON_MODEL", "claude-sonnet-4-5")
    monkeypatch.setenv(SETTING[wire], url)
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert (
        f"The models at {url} ({SETTING[wire]}) could not be listed: its GET /models "
        "answered with text/html, not a list of models\n"
    ) in result.output


def test_heron_models_with_a_model_that_cannot_be_used_exits_1(tmp_path):
    """`heron models --model /nowhere.gguf` printed "In use: none" and exited 0 (QA22u L8)."""
    from typer.testing import CliRunner

    from heron.cli import app

    result = CliRunner().invoke(app, ["models", "--model", str(tmp_path / "none.gguf")])
    assert result.exit_code == 1, result.output
    assert f"In use: none. No GGUF file at {tmp_path / 'none.gguf'}" in result.output
