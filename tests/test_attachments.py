"""Attachments: files made into parts (heron/attachments.py), their bytes kept by reference
(heron/store/files.py), a turn that carries them, and what each wire sends of them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from pathlib import Path

import pytest

from heron import attachments
from heron.agent.engine import Engine
from heron.channels.inprocess import connect
from heron.config import AttachmentCaps, Settings
from heron.context.tokens import FILE_TOKENS, PER_MESSAGE, estimate_message
from heron.errors import AttachmentError
from heron.messages import File, Message, Reply, Text, from_json, part_from_dict, to_json
from heron.providers.anthropic import AnthropicProvider
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.profiles import profile_for
from heron.providers.scripted import ScriptedProvider
from heron.request import ChatRequest
from heron.store import Store
from heron.testing.fake_anthropic import FakeAnthropicServer
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(40))
PDF = b"%PDF-1.7\n" + b"x" * 100
CAPS = AttachmentCaps()


# ---- files into parts ---------------------------------------------------------------------------


def test_the_media_type_comes_from_the_bytes_then_the_name_then_the_sender():
    assert attachments.media_type_of("photo.txt", PNG) == "image/png"  # the bytes win
    assert attachments.media_type_of("a.jpg", b"\xff\xd8\xff\xe0junk") == "image/jpeg"
    assert attachments.media_type_of("a", b"GIF89a...") == "image/gif"
    assert attachments.media_type_of("a", b"RIFF\x10\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert attachments.media_type_of("r", PDF) == "application/pdf"
    assert attachments.media_type_of("notes.md", b"# hi") == "text/markdown"
    assert attachments.media_type_of("blob", b"\x01\x02", "image/heic") == "image/heic"
    assert attachments.media_type_of("blob", b"\x01\x02", "not a type") == attachments.OCTET


def test_a_path_becomes_a_file_with_its_name_type_size_and_hash(tmp_path):
    (tmp_path / "photo.png").write_bytes(PNG)
    made = attachments.from_path(tmp_path / "photo.png", CAPS)
    assert (made.name, made.media_type, made.size) == ("photo.png", "image/png", len(PNG))
    assert made.sha256 == hashlib.sha256(PNG).hexdigest() and made.data == PNG


def test_missing_folder_unreadable_and_oversized_paths_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(AttachmentError, match=r"no file nope\.png") as missing:
        attachments.from_path("nope.png", CAPS)
    assert missing.value.hint
    with pytest.raises(AttachmentError, match="is a folder"):
        attachments.from_path(tmp_path, CAPS)

    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (2 * 1024 * 1024 + 1))
    with pytest.raises(AttachmentError) as over:
        attachments.from_path(big, AttachmentCaps(max_file_mb=2))
    assert str(over.value.args[0]) == f"{big} is 2.0 MB, over the 2 MB cap per file"
    assert "max_file_mb" in (over.value.hint or "")

    secret = tmp_path / "secret.txt"
    secret.write_text("x")

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied")

    # Tests run as root here, where chmod 000 still reads: the refusal is the OS's answer.
    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(AttachmentError, match=r"cannot read .*secret\.txt: permission denied"):
        attachments.from_path(secret, CAPS)


def test_the_files_of_one_message_have_a_cap_together():
    one = File("image/png", b"a" * (600 * 1024), "a.png")
    two = File("image/png", b"b" * (600 * 1024), "b.png")
    caps = AttachmentCaps(max_file_mb=1, max_turn_mb=1)
    attachments.check_total([one], caps)
    with pytest.raises(AttachmentError) as over:
        attachments.check_total([one, two], caps)
    assert over.value.args[0] == (
        "the files of this message (a.png, b.png) are 1.2 MB together, over the 1 MB cap per "
        "message"
    )


def test_text_files_go_inline_as_fenced_blocks_and_the_rest_stay_files():
    notes = File("text/plain", b"a ``` fence inside\nline 2\n", "notes.txt")
    parts = attachments.message_parts("read these", [notes, File("image/png", PNG, "p.png")], CAPS)
    assert parts[0] == Text("read these")
    assert parts[1] == Text("\n\nnotes.txt:\n````\na ``` fence inside\nline 2\n````")
    assert isinstance(parts[2], File) and parts[2].name == "p.png"
    # Not UTF-8, or past the inline size: kept as a file.
    latin = File("text/plain", "café".encode("latin-1"), "l.txt")
    assert attachments.message_parts("", [latin], CAPS) == [latin]
    long = File("text/plain", b"x" * 2048, "long.txt")
    assert attachments.message_parts("", [long], AttachmentCaps(inline_text_kb=1)) == [long]


def test_the_caps_come_from_config(tmp_path):
    home = Settings.load().paths.home
    (home / "config.toml").write_text("[attachments]\nmax_file_mb = 5\nmax_turn_mb = 8\n")
    caps = Settings.load().config.attachments
    assert (caps.max_file, caps.max_turn) == (5 * 1024 * 1024, 8 * 1024 * 1024)
    (home / "config.toml").write_text("[attachments]\nmax_file_mb = -1\n")
    with pytest.raises(Exception, match=r"\[attachments\] max_file_mb must be above 0"):
        Settings.load()


# ---- bytes by reference -------------------------------------------------------------------------


def test_a_file_part_is_stored_by_reference_and_its_bytes_content_addressed():
    settings = Settings.load()
    store = Store(settings.paths.ensure().db, files=settings.paths.files)
    conv = store.open_conversation("k")
    message = Message("user", [Text("see"), File("image/png", PNG, "p.png")])
    store.begin_turn(conv.id, "r1", message)
    store.begin_turn(conv.id, "r2", Message("user", [File("image/png", PNG, "again.png")]))
    raw = store.query("SELECT parts FROM messages ORDER BY id")[0]["parts"]
    sha = hashlib.sha256(PNG).hexdigest()
    assert json.loads(raw)[1] == {
        "kind": "file",
        "media_type": "image/png",
        "name": "p.png",
        "sha256": sha,
        "size": len(PNG),
    }
    assert base64.b64encode(PNG).decode() not in raw
    kept = list(settings.paths.files.rglob("*"))
    assert [p for p in kept if p.is_file()] == [settings.paths.files / sha[:2] / sha]  # once

    fresh = Store(settings.paths.db, files=settings.paths.files)  # a new process
    rows = fresh.branch(conv.id)
    part = rows[0].message.parts[1]
    assert isinstance(part, File) and part.data is None and part.size == len(PNG)
    loaded = fresh.load_files([r.message for r in rows])
    assert [p.data for m in loaded for p in m.parts if isinstance(p, File)] == [PNG, PNG]
    # The kept branch (this Store's cache) holds no bytes either.
    assert all(
        p.data is None
        for r in store.branch(conv.id)
        for p in r.message.parts
        if isinstance(p, File)
    )


def test_a_file_whose_bytes_are_gone_still_names_itself_to_the_model():
    settings = Settings.load()
    store = Store(settings.paths.ensure().db, files=settings.paths.files)
    conv = store.open_conversation("k")
    store.begin_turn(conv.id, "r1", Message("user", [File("image/png", PNG, "p.png")]))
    for kept in settings.paths.files.rglob("*"):
        if kept.is_file():
            kept.unlink()
    loaded = store.load_files([r.message for r in store.branch(conv.id)])
    part = loaded[0].parts[0]
    assert isinstance(part, File) and part.data is None
    body = OpenAICompatProvider("gpt-4o", "k").payload(ChatRequest("gpt-4o", "", loaded))
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "[image p.png, 56 bytes: its bytes are no longer kept]"}
    ]


def test_a_part_round_trips_by_reference_and_old_inline_rows_still_read():
    part = File("application/pdf", PDF, "r.pdf")
    back = from_json(to_json(Message("user", [part]))).parts[0]
    assert back == part and isinstance(back, File) and back.data is None
    old = {"kind": "file", "media_type": "image/png", "data": base64.b64encode(PNG).decode()}
    legacy = part_from_dict(old)
    assert isinstance(legacy, File) and legacy.data == PNG and legacy.size == len(PNG)
    with pytest.raises(TypeError):
        part_from_dict({"kind": "file", "media_type": "x/y", "sha256": "ab", "size": "3"})


def test_an_image_costs_a_fixed_estimate():
    message = Message("user", [File("image/png", PNG, "p.png")])
    assert estimate_message(message) == PER_MESSAGE + FILE_TOKENS


# ---- a turn with files --------------------------------------------------------------------------


async def test_a_turn_sends_its_files_and_the_next_turn_sends_them_again():
    provider = ScriptedProvider([Reply([Text("a cat")], "done"), Reply([Text("yes")], "done")])
    delivered: list[object] = []

    async def deliver(item: object) -> None:
        delivered.append(item)

    notes = File("text/plain", b"buy milk", "todo.txt")
    photo = File("image/png", PNG, "cat.png")
    settings = Settings.load()
    async with Engine.open(settings, provider=provider) as engine:
        async with connect(engine, "terminal", "t", deliver, idle=False) as agent:
            await agent.send("what is this?", "k", files=(photo, notes))
            await agent.settle()
            await agent.send("sure?", "k")
            await agent.settle()
        conv = engine.store.conversation("k")
        assert conv is not None and conv.title == "what is this?"
        raw = engine.store.query("SELECT parts FROM messages ORDER BY id")[0]["parts"]
    first, second = (r.messages for r in provider.requests)
    sent = first[-1].parts
    assert sent[0] == Text("what is this?")
    assert isinstance(sent[1], File) and sent[1].data == PNG and sent[1].name == "cat.png"
    assert sent[2] == Text("\n\ntodo.txt:\n```\nbuy milk\n```")
    again = [p for p in second[0].parts if isinstance(p, File)]
    assert [p.data for p in again] == [PNG]  # read back from HERON_HOME/files
    assert "buy milk" in raw and base64.b64encode(PNG).decode() not in raw


async def test_a_message_with_files_waits_for_its_own_turn_rather_than_the_mailbox():
    """Mail is text: a message with files typed during a turn opens the next turn."""
    from heron.agent.loop import AgentLoop
    from heron.bus import InboundMessage, MessageBus

    asked, release = asyncio.Event(), asyncio.Event()
    replies = [Reply([Text("one")], "done"), Reply([Text("two")], "done")]

    async def answer(request: ChatRequest) -> Reply:
        asked.set()
        await release.wait()  # the first turn runs until the second message is in
        return replies.pop(0)

    provider = ScriptedProvider(answer)
    async with Engine.open(Settings.load(), provider=provider) as engine:
        loop = AgentLoop(engine, MessageBus())
        await loop.dispatch(InboundMessage("terminal", "t", "first", "k"))
        await asyncio.wait_for(asked.wait(), 60)
        photo = File("image/png", PNG, "p.png")
        await loop.dispatch(InboundMessage("terminal", "t", "and this", "k", files=(photo,)))
        assert loop.pending("k") == 1
        release.set()
        await loop.wait_idle()
        await loop.close()
    assert [p.data for p in provider.requests[1].messages[-1].parts if isinstance(p, File)] == [PNG]


# ---- the wires ---------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def test_anthropic_gets_images_and_pdfs_as_blocks():
    server = FakeAnthropicServer([ServerReply(text="ok")])
    provider = AnthropicProvider("claude-sonnet-4", "key", base_url=server.start(), timeout=10)
    try:
        parts = [
            Text("look"),
            File("image/png", PNG, "p.png"),
            File("application/pdf", PDF, "r.pdf"),
        ]
        await provider.chat(ChatRequest("claude-sonnet-4", "", [Message("user", parts)]))
    finally:
        await provider.aclose()
        server.stop()
    content = server.requests[0]["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "look"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": _b64(PNG)},
        },
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": _b64(PDF)},
            "title": "r.pdf",
            "cache_control": {"type": "ephemeral"},
        },
    ]


async def test_openai_gets_images_as_data_urls_and_pdfs_as_file_parts():
    server = FakeOpenAIServer([ServerReply(text="ok")])
    provider = OpenAICompatProvider("gpt-4.1-mini", "key", base_url=server.start())
    try:
        parts = [
            Text("look"),
            File("image/png", PNG, "p.png"),
            File("application/pdf", PDF, "r.pdf"),
        ]
        await provider.chat(ChatRequest("gpt-4.1-mini", "", [Message("user", parts)]))
    finally:
        await provider.aclose()
        server.stop()
    assert server.requests[0]["messages"][0] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_b64(PNG)}"}},
            {
                "type": "file",
                "file": {
                    "filename": "r.pdf",
                    "file_data": f"data:application/pdf;base64,{_b64(PDF)}",
                },
            },
        ],
    }


async def test_a_model_without_vision_gets_a_note_not_an_error():
    server = FakeOpenAIServer([ServerReply(text="ok")])
    model = "SmolLM2-135M-Instruct"
    assert not profile_for(model).vision and not profile_for("some-local-model").pdf
    provider = OpenAICompatProvider(model, "key", base_url=server.start())
    try:
        photo = File("image/png", b"\x89PNG\r\n\x1a\n" + b"x" * (123 * 1024), "photo.png")
        parts = [Text("look"), photo, File("application/pdf", PDF, "r.pdf")]
        reply = await provider.chat(ChatRequest(model, "", [Message("user", parts)]))
    finally:
        await provider.aclose()
        server.stop()
    assert reply.text == "ok"
    assert server.requests[0]["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "text", "text": "[image photo.png, 123 kB: this model does not take images]"},
        {"type": "text", "text": "[PDF r.pdf, 109 bytes: this model does not take PDFs]"},
    ]


def test_the_vision_and_pdf_flags_by_model_and_in_config():
    for name in ("claude-sonnet-4-5", "gpt-4o-mini", "gpt-4.1", "gpt-5-mini"):
        assert profile_for(name).vision and profile_for(name).pdf, name
    for name in ("smollm2-135m", "qwen2.5-7b", "llama3.2"):
        assert not profile_for(name).vision and not profile_for(name).pdf, name
    assert profile_for("llava-7b", {"llava*": {"vision": True}}).vision


def test_a_folded_turn_keeps_the_names_of_its_files():
    from heron.compaction.summary import transcript

    rendered = transcript([Message("user", [Text("see"), File("image/png", PNG, "cat.png")])])
    assert rendered == "User: see\nUser attached: cat.png (image/png, 56 bytes)"


async def test_heron_s_own_keys_leave_every_attached_text_file(
    heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attached config or .env (inline, or a File part over the inline cap) reaches neither
    the store nor a request with a key Heron holds in it; an image is kept byte for byte."""
    key = "sk-test-attachedkey-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    provider = ScriptedProvider([Reply([Text("ok")], "done")])
    small = File("text/plain", f"OPENAI_API_KEY={key}\n".encode(), ".env")
    big = File("text/plain", (f"api = {key}\n" + "x" * 200_000).encode(), "big.toml")
    photo = File("image/png", PNG, "cat.png")
    async with (
        Engine.open(Settings.load(), provider=provider) as engine,
        connect(engine, "terminal", "t", lambda _item: asyncio.sleep(0)) as agent,
    ):
        await agent.send("look", "k", files=(small, big, photo))
        await agent.settle()
    sent = provider.requests[0].messages[-1].parts
    assert "OPENAI_API_KEY=[redacted: configured key]" in str(sent)
    assert "api = [redacted: configured key]" in str(sent)  # the large one's excerpt
    assert key not in str(sent) and any(isinstance(p, File) and p.data == PNG for p in sent)
    kept = b"".join(p.read_bytes() for p in heron_home.rglob("*") if p.is_file())
    assert key.encode() not in kept


async def test_conversations_show_prints_an_attached_text_file_under_its_message(tmp_path):
    """`heron conversations show` printed a text file that went inline as a second, empty
    `you:` line with the file after it (QA21v L4): it is said as attached to the message, its
    block under that line, and a file kept as a file is named as before."""
    from io import StringIO

    from typer.testing import CliRunner

    from heron.channels.script import run_once
    from heron.cli import app

    notes, png = tmp_path / "notes.txt", tmp_path / "p.png"
    notes.write_text("hello file\n")
    png.write_bytes(PNG)
    files = tuple(attachments.from_path(p, CAPS) for p in (notes, png))
    provider = ScriptedProvider(lambda request: Reply([Text("Read.")], "done"))
    out, err = StringIO(), StringIO()
    ran = await run_once(
        Settings.load(), "read this", "default", "att", None, False, out, err, provider, files=files
    )
    assert ran, err.getvalue()
    shown = await asyncio.to_thread(CliRunner().invoke, app, ["conversations", "show", "att"])
    lines = shown.stdout.splitlines()
    start = lines.index("you: read this")
    assert lines[start + 1 : start + 7] == [
        "you attached notes.txt (text/plain, 11 bytes):",
        "```",
        "hello file",
        "```",
        "you attached p.png (image/png, 56 bytes)",
        "assistant: Read.",
    ]
    assert "you: " not in lines and "you:" not in lines
