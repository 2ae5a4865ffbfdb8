"""An attached PDF is counted by its pages: the count is read when the file is attached (pypdf),
kept in the `File` part and its stored JSON, and the context estimate is per page; a PDF over
its message's share of the window is not sent but noted, with a copy in the workspace, and the
person is told once. A PDF pypdf cannot read is attached all the same, its pages unknown."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pypdf
import pytest
from test_attachments_large import _two_turns  # a turn with the file, then a follow-up
from typer.testing import CliRunner

from heron.attachments import from_bytes, from_path, pdf_pages
from heron.channels.terminal import ChatState, attach_command
from heron.cli import app
from heron.config import AttachmentCaps, Settings
from heron.context.long_message import allotments
from heron.context.tokens import FILE_TOKENS, PDF_PAGE_TOKENS, PER_MESSAGE, estimate_message
from heron.messages import File, Message, Text, part_from_dict, part_to_dict
from heron.providers.openai_compat import OpenAICompatProvider
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
from heron.web.uploads import Upload, save, uploaded_files

CAPS = AttachmentCaps()
WINDOW = 128_000  # a quarter of it, 32,000 tokens, is one message's share: ten pages fit


def make_pdf(pages: int, *, password: str | None = None) -> bytes:
    """A real PDF of `pages` blank letter pages, as pypdf writes it."""
    writer = pypdf.PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(612, 792)
    if password is not None:
        writer.encrypt(password, algorithm="RC4-128")  # RC4 needs no crypto library
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


# ---- counted when attached ------------------------------------------------------------------


def test_a_pdf_s_pages_are_counted_when_attached_from_a_path_or_bytes(tmp_path: Path):
    data = make_pdf(12)
    (tmp_path / "report.pdf").write_bytes(data)
    made = from_path(tmp_path / "report.pdf", CAPS)
    assert (made.media_type, made.pages, made.data) == ("application/pdf", 12, data)
    assert from_bytes("report.pdf", data, CAPS, "application/pdf").pages == 12
    # A PDF named otherwise is still told by its bytes, and counted.
    assert from_bytes("scan.bin", data, CAPS).pages == 12
    assert from_bytes("p.png", b"\x89PNG\r\n\x1a\n" + bytes(40), CAPS).pages == 0
    # `/attach` in heron chat says what it took, pages included.
    said = attach_command(str(tmp_path / "report.pdf"), ChatState("k", "default"))
    assert said.startswith("Attached report.pdf (application/pdf, ") and "12 pages)" in said


def test_a_pdf_pypdf_cannot_read_is_attached_with_its_pages_unknown(tmp_path: Path):
    whole = make_pdf(12)
    damaged = [b"%PDF-1.7\n" + b"x" * 100, whole[: len(whole) // 2], b"%PDF-"]
    for data in [*damaged, make_pdf(3, password="secret")]:
        assert pdf_pages(data) == 0
        made = from_bytes("bad.pdf", data, CAPS)  # never an error
        assert made.media_type == "application/pdf" and made.pages == 0
        assert estimate_message(Message("user", [made])) == PER_MESSAGE + FILE_TOKENS
    # Encrypted with an empty password (permissions only): readers open it, and so does pypdf.
    assert pdf_pages(make_pdf(3, password="")) == 3


def test_the_serve_s_uploads_count_the_pages_too(tmp_path: Path):
    """The browser's upload and a terminal's upload through a serve become parts here."""
    data = make_pdf(4)
    save(tmp_path, Upload("a" * 24, "r.pdf", "application/pdf", len(data)), data)
    (made,) = uploaded_files(tmp_path, [{"upload_id": "a" * 24}], CAPS)
    assert made.pages == 4 and made.data == data


# ---- kept with the part -------------------------------------------------------------------------


def test_the_count_is_stored_with_the_part_and_read_back_without_its_bytes():
    data = make_pdf(12)
    settings = Settings.load()
    store = Store(settings.paths.ensure().db, files=settings.paths.files)
    conv = store.open_conversation("k")
    part = from_bytes("report.pdf", data, CAPS)
    store.begin_turn(conv.id, "r1", Message("user", [Text("read"), part]))
    raw = json.loads(store.query("SELECT parts FROM messages")[0]["parts"])[1]
    assert raw["pages"] == 12 and "data" not in raw

    fresh = Store(settings.paths.db, files=settings.paths.files)  # a new process
    back = fresh.branch(conv.id)[0].message.parts[1]
    assert isinstance(back, File) and back.data is None and back.pages == 12
    # The estimate is the same with the bytes loaded and without them.
    (loaded,) = fresh.load_files([Message("user", [back])])
    assert loaded.parts[0].data == data  # type: ignore[union-attr]
    unloaded = estimate_message(Message("user", [back]))
    assert unloaded == estimate_message(loaded) == PER_MESSAGE + 12 * PDF_PAGE_TOKENS


def test_other_parts_json_is_unchanged_and_old_rows_read_as_unknown():
    png = File("image/png", b"\x89PNG\r\n\x1a\n", "p.png")
    assert "pages" not in part_to_dict(png)  # every other file's row is as it always was
    sha = hashlib.sha256(b"x").hexdigest()
    old = {"kind": "file", "media_type": "application/pdf", "name": "r.pdf", "sha256": sha,
           "size": 1}  # fmt: skip
    read = part_from_dict(old)
    assert isinstance(read, File) and read.pages == 0
    assert estimate_message(Message("user", [read])) == PER_MESSAGE + FILE_TOKENS
    for bad in ("3", -1, True, 2.5):
        try:
            part_from_dict({**old, "pages": bad})
        except TypeError:
            continue
        raise AssertionError(f"pages {bad!r} was accepted")


def test_the_estimate_counts_a_pdf_by_its_pages_and_images_stay_flat():
    pdf = File("application/pdf", make_pdf(200), "big.pdf", pages=200)
    assert estimate_message(Message("user", [pdf])) == PER_MESSAGE + 200 * PDF_PAGE_TOKENS
    image = File("image/png", b"\x89PNG\r\n\x1a\n", "p.png")
    assert estimate_message(Message("user", [image])) == PER_MESSAGE + FILE_TOKENS


# ---- over its share -------------------------------------------------------------------------


def test_a_pdf_goes_whole_or_not_at_all_within_the_message_s_share():
    pdf = File("application/pdf", None, "r.pdf", 10, "ab" * 32, pages=5)  # 15,000 tokens
    typed = Text("t" * 50_000)
    # Both fit in 140,000 characters: nothing is cut.
    assert allotments(Message("user", [typed, pdf]), 140_000) == {}
    # A PDF has a share of its own, twice the message's (60,000 characters fit in 2 x 40,000),
    # so the typed text is cut to the message's share alone, and the PDF goes whole.
    assert allotments(Message("user", [typed, pdf]), 40_000) == {0: 40_000}
    # Past its own share, the PDF is not cut to a part of itself: it goes (0), and the text
    # keeps its room.
    assert allotments(Message("user", [typed, pdf]), 29_000) == {0: 29_000, 1: 0}
    assert allotments(Message("user", [pdf]), 25_000) == {0: 0}
    # Two PDFs: the smaller first, the larger only if both fit.
    small = File("application/pdf", None, "s.pdf", 10, "cd" * 32, pages=1)  # 12,000 characters
    both = Message("user", [Text("which?"), pdf, small])
    assert allotments(both, 36_000) == {}  # 72,000 fit in 2 x 36,000
    assert allotments(both, 30_000) == {1: 0}  # 60,000 left after the small one: too little
    # An unknown count is outside the share, as every image is.
    unknown = File("application/pdf", None, "r.pdf", 10, "ab" * 32)
    assert allotments(Message("user", [typed, unknown]), 20_000) == {0: 20_000}


def _file_parts(body: dict[str, object]) -> list[object]:
    messages = body["messages"]
    assert isinstance(messages, list)
    return [
        p
        for m in messages
        if isinstance(m["content"], list)
        for p in m["content"]
        if p.get("type") == "file"
    ]


async def test_a_pdf_over_its_share_is_noted_saved_and_told_not_sent(monkeypatch, tmp_path):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", str(WINDOW))
    data = make_pdf(40)  # 120,000 tokens: past the share, and the whole window
    (tmp_path / "big.pdf").write_bytes(data)
    with FakeOpenAIServer([ServerReply(text="ok"), ServerReply(text="ok")], window=WINDOW) as srv:
        provider = OpenAICompatProvider("gpt-4o", "key", base_url=srv.base_url)
        told, settings = await _two_turns(provider, tmp_path / "big.pdf")
    (saved,) = (settings.paths.workspace / ".heron" / "messages").iterdir()
    assert saved.name.endswith(".pdf") and saved.read_bytes() == data  # for the agent's tools
    assert len(srv.requests) == 2
    for body in srv.requests:
        assert _file_parts(body) == []  # never sent over the window
        raw = json.dumps(body)
        assert "Attached PDF big.pdf" in raw and "40 pages" in raw
        assert f".heron/messages/{saved.name}" in raw
    said = [t for t in told if "big.pdf has 40 pages, about 120,000 tokens" in t]
    assert len(said) == 1 and saved.name in said[0] and "fewer pages" in said[0]  # told once
    # The record keeps the file whole, with its count.
    out = CliRunner().invoke(app, ["conversations", "show", "big"])
    assert "big.pdf (application/pdf, " in out.output and "40 pages)" in out.output, out.output


async def test_a_pdf_within_its_share_is_sent_as_a_document(monkeypatch, tmp_path):
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", str(WINDOW))
    (tmp_path / "small.pdf").write_bytes(make_pdf(3))
    with FakeOpenAIServer([ServerReply(text="ok"), ServerReply(text="ok")], window=WINDOW) as srv:
        provider = OpenAICompatProvider("gpt-4o", "key", base_url=srv.base_url)
        told, settings = await _two_turns(provider, tmp_path / "small.pdf")
    assert [len(_file_parts(body)) for body in srv.requests] == [1, 1]
    assert not (settings.paths.workspace / ".heron" / "messages").exists()
    assert not [t for t in told if "small.pdf has" in t]


def test_an_upload_lasts_until_a_message_takes_it_or_a_day(tmp_path: Path):
    """Uploads were never removed: repeated ones filled the disk."""
    import os
    import time

    from heron.errors import AttachmentError
    from heron.web.uploads import KEPT_S, load_upload

    data = make_pdf(1)
    save(tmp_path, Upload("a" * 24, "r.pdf", "application/pdf", len(data)), data)
    save(tmp_path, Upload("b" * 24, "s.pdf", "application/pdf", len(data)), data)
    uploaded_files(tmp_path, [{"upload_id": "a" * 24}], CAPS)
    assert load_upload(tmp_path, "a" * 24) is None  # the message has it now
    old = time.time() - KEPT_S - 60
    for path in (tmp_path / "uploads").glob("b*"):
        os.utime(path, (old, old))
    save(tmp_path, Upload("c" * 24, "t.pdf", "application/pdf", len(data)), data)
    assert load_upload(tmp_path, "b" * 24) is None  # a day old, never sent
    assert load_upload(tmp_path, "c" * 24) is not None
    with pytest.raises(AttachmentError):
        uploaded_files(tmp_path, [{"upload_id": "c" * 24}], AttachmentCaps(max_turn_mb=0.0001))
    assert load_upload(tmp_path, "c" * 24) is not None  # refused: kept for another try
