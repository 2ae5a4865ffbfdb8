"""A text file attached over `[attachments] inline_text_kb` is treated as a long pasted message:
the model gets its head, its tail and the path of a saved copy, within `[context]
user_message`'s share, on every turn, through both wires and through the browser's upload;
the context estimate counts what it sends. Images and PDFs over the per-file cap stay refused
before anything is sent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from serve_helpers import running_serve, ws_client, ws_hello, ws_until
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.attachments import from_path, message_parts
from heron.channels.inprocess import connect
from heron.cli import app
from heron.config import AttachmentCaps, Settings
from heron.context.long_message import allotments
from heron.context.tokens import PER_MESSAGE, estimate_message
from heron.context.view import ViewOptions, ViewPlan, derive_view
from heron.messages import File, Message, Text
from heron.providers.anthropic import AnthropicProvider
from heron.providers.base import Provider
from heron.providers.openai_compat import OpenAICompatProvider
from heron.store.records import StoredMessage
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

WINDOW = 128_000
SHARE = WINDOW // 4 * 4  # [context] user_message (a quarter of the window), in characters


def _big_text() -> bytes:
    """About 3 MB of text (750,000 tokens, past any 128k window), marked at both ends and in
    the middle, far past the 256 kB that go inline."""
    lines = [f"line {i:07d} of the big log\n" for i in range(110_000)]
    lines.insert(55_000, "MIDDLE-MARK\n")
    return ("START-MARK\n" + "".join(lines) + "END-MARK").encode()


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    path = tmp_path / "big.txt"
    path.write_bytes(_big_text())
    assert path.stat().st_size > 3_000_000
    return path


async def _two_turns(provider: Provider, path: Path) -> tuple[list[str], Settings]:
    """A turn with the big file, then a plain follow-up, through the in-process channel."""
    settings = Settings.load()
    told: list[str] = []

    async def deliver(item: object) -> None:
        told.append(repr(item))

    file = from_path(path, settings.config.attachments)
    async with (
        Engine.open(settings, provider=provider) as engine,
        connect(engine, "terminal", "t", deliver, idle=False) as agent,
    ):
        await agent.send("summarize this file", "big", files=(file,))
        await agent.settle()
        await agent.send("and the last line?", "big")
        await agent.settle()
    return told, settings


def _saved_copy(settings: Settings) -> Path:
    (saved,) = (settings.paths.workspace / ".heron" / "messages").iterdir()
    return saved


async def test_openai_wire_gets_head_tail_and_the_saved_copy_on_every_turn(monkeypatch, big_file):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", str(WINDOW))
    data = big_file.read_bytes()
    # The server refuses a prompt past its window, as a real one does.
    with FakeOpenAIServer([ServerReply(text="ok"), ServerReply(text="ok")], window=WINDOW) as srv:
        provider = OpenAICompatProvider("fake-model", "key", base_url=srv.base_url)
        told, settings = await _two_turns(provider, big_file)
    assert srv.over_window == 0 and len(srv.requests) == 2
    saved = _saved_copy(settings)
    assert saved.read_bytes() == data  # the agent can open the whole file with its tools
    for body in srv.requests:
        raw = json.dumps(body)
        assert len(raw) < SHARE + 20_000, len(raw)  # the share, not 3 MB
        assert "START-MARK" in raw and "END-MARK" in raw and "MIDDLE-MARK" not in raw
        assert f".heron/messages/{saved.name}" in raw and "big.txt" in raw
    assert sum("big.txt is about 7" in t and saved.name in t for t in told) == 1  # told once


async def test_anthropic_wire_gets_the_same_and_no_document_block(monkeypatch, big_file):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", str(WINDOW))
    server = FakeAnthropicServer([ServerReply(text="ok"), ServerReply(text="ok")])
    provider = AnthropicProvider("claude-sonnet-4-5", "key", base_url=server.start(), timeout=10)
    try:
        _, settings = await _two_turns(provider, big_file)
    finally:
        server.stop()
    saved = _saved_copy(settings)
    assert len(server.requests) == 2
    for body in server.requests:
        raw = json.dumps(body)
        assert len(raw) < SHARE + 20_000, len(raw)
        assert "START-MARK" in raw and "END-MARK" in raw and "MIDDLE-MARK" not in raw
        assert f".heron/messages/{saved.name}" in raw
        blocks = [b for m in body["messages"] for b in m["content"] if isinstance(b, dict)]
        assert not [b for b in blocks if b.get("type") == "document"]


async def test_the_browser_upload_is_cut_the_same_way(monkeypatch):
    """POST /api/uploads, then a `send` naming the upload over /ws, through a real serve."""
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", str(WINDOW))
    data = _big_text()
    with FakeOpenAIServer([ServerReply(text="read it")], window=WINDOW) as srv:
        provider = OpenAICompatProvider("fake-model", "key", base_url=srv.base_url)
        async with running_serve(provider) as serve:
            async with serve.http(timeout=30) as http:
                made = await http.post(
                    "/api/uploads",
                    params={"name": "big.txt"},
                    content=data,
                    headers={"Content-Type": "text/plain", "Origin": serve.url},
                )
            assert made.status_code == 201, made.text
            upload = made.json()
            async with ws_client(serve) as ws:
                await ws_hello(ws)
                files = [
                    {"name": "big.txt", "mime": "text/plain", "upload_id": upload["upload_id"]}
                ]
                await ws.send(json.dumps({"type": "send", "text": "summarize", "files": files}))
                events = await ws_until(ws, "idle")
    assert srv.over_window == 0 and len(srv.requests) == 1, events
    raw = json.dumps(srv.requests[0])
    assert len(raw) < SHARE + 20_000
    assert "START-MARK" in raw and "END-MARK" in raw and "MIDDLE-MARK" not in raw
    assert ".heron/messages/big.txt-" in raw
    assert any("big.txt is about" in json.dumps(e) for e in events)  # the person is told


def test_a_text_file_counts_what_it_sends_in_the_estimate():
    data = b"word " * 100_000  # 500 kB: over the inline cap, so a File part
    (_, file) = message_parts("look", [File("text/plain", data, "w.txt")], AttachmentCaps())
    assert isinstance(file, File)
    loaded = estimate_message(Message("user", [file]))
    assert loaded == PER_MESSAGE + len(data) // 4  # its text, four bytes a token
    assert estimate_message(Message("user", [file.without_data()])) == loaded  # bytes or not


def test_conversations_show_budget_counts_the_attachment(monkeypatch, big_file):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", str(WINDOW))
    with FakeOpenAIServer([ServerReply(text="ok"), ServerReply(text="ok")], window=WINDOW) as srv:
        provider = OpenAICompatProvider("fake-model", "key", base_url=srv.base_url)
        asyncio.run(_two_turns(provider, big_file))
    out = CliRunner().invoke(app, ["conversations", "show", "big", "--budget"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if "recent turns (the view)" in x)
    shown = int(line.split()[-1].replace(",", ""))
    # What the view sends of the file (its share, about 32,000 tokens), not a fixed 1,000.
    assert SHARE // 4 * 0.9 < shown < SHARE // 4 * 1.2, line


def _rows(*messages: Message) -> list[StoredMessage]:
    return [
        StoredMessage(i + 1, 1, i or None, None, "message", m, None, 0.0)
        for i, m in enumerate(messages)
    ]


def test_the_share_is_the_whole_message_split_between_its_large_parts(tmp_path: Path):
    """A message whose typed text and attached file are both large: together within the share;
    a part that fits an even split keeps its size."""
    typed = "t" * 5_000
    file = File("text/plain", b"F" * 50_000 + b"TAIL", "f.txt")
    message = Message("user", [Text(typed), file])
    assert allotments(message, 100_000) == {}  # it fits: nothing is read or cut
    assert allotments(message, 20_000) == {1: 15_000}
    read = {file.sha256: file.data}.get
    opts = ViewOptions(workspace=tmp_path, user_chars=20_000, read_file=read)
    (shown,) = derive_view(
        _rows(Message("user", [Text(typed), file.without_data()])), ViewPlan(), opts
    )
    first, second = shown.parts
    assert first == Text(typed)
    assert isinstance(second, Text) and second.text.endswith("TAIL")
    assert 15_000 < len(second.text) < 15_600  # its allotment and the notes
    big = Message("user", [Text("a" * 30_000), Text("b" * 30_000)])
    assert allotments(big, 20_000) == {0: 10_000, 1: 10_000}
    # Without its bytes the view cannot cut the file: it stays a part, which the estimate
    # counts whole (so the request is refused before it goes out, never sent over the window).
    (kept,) = derive_view(
        _rows(Message("user", [file.without_data()])), ViewPlan(), ViewOptions(user_chars=2_000)
    )
    assert kept.parts == (file,)


@pytest.mark.parametrize(
    ("name", "head"),
    [("scan.pdf", b"%PDF-1.7\n"), ("photo.png", b"\x89PNG\r\n\x1a\n")],
)
def test_a_pdf_or_image_over_the_cap_is_refused_before_sending(monkeypatch, tmp_path, name, head):
    path = tmp_path / name
    path.write_bytes(head + b"\0" * (1024 * 1024 + 10))
    Settings.load().paths.ensure().config.write_text("[attachments]\nmax_file_mb = 1\n")
    with FakeOpenAIServer([ServerReply(text="ok")]) as srv:
        monkeypatch.setenv("HERON_BASE_URL", srv.base_url)
        monkeypatch.setenv("HERON_MODEL", "gpt-4o")  # a model that takes images and PDFs
        monkeypatch.setenv("HERON_API_KEY", "key")
        out = CliRunner().invoke(app, ["run", "-a", str(path), "what is this?"])
    assert out.exit_code == 2, out.output  # refused before any turn
    assert f"{path} is 1.0 MB, over the 1 MB cap per file" in out.output
    assert "max_file_mb" in out.output
    assert srv.requests == []  # nothing was sent
