"""Attachments: a file the person attaches, as the parts of their message.

Every channel makes its files here (`from_path` for a path on the terminal, `from_bytes` for an
upload), so one set of rules holds everywhere:

- caps: `[attachments] max_file_mb` per file (20 MB by default) and `max_turn_mb` for all the
  files of one message (50 MB), refused with an error naming the file, its size and the cap;
- the media type comes from the bytes when they say it (PNG, JPEG, GIF, WebP, PDF), else from
  the name (`mimetypes`), else from what the sender declared;
- a PDF's pages are counted (`pdf_pages`, with pypdf) and kept in its `File` part: a provider
  reads a PDF page by page, so its context estimate is per page (heron/context/tokens.py);
- `compose` puts a text file (UTF-8, at most `inline_text_kb`) into the message inline, as a
  fenced block under its name, and keeps anything else as a `File` part: its bytes go to the
  store's content-addressed folder, its row holds a reference (heron/store/files.py). A longer
  text file still reaches the model as text, within the message's share of the window (the
  view shows its head and tail and a saved copy: heron/context/long_message.py). The row's
  meta names the files put in inline (`INLINE_META`), so the person's screens show them as
  attachments, not as the fenced text the model reads (`unfenced` takes the text back out).

What each model then receives of a `File` (an image block, a document, or a short note for a
model that takes neither) is the adapters' business (heron/providers/wire.py `file_note`).
"""

from __future__ import annotations

import io
import logging
import mimetypes
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heron.config import AttachmentCaps
from heron.errors import AttachmentError
from heron.messages import File, JSONValue, Message, Part, Text, size_label

# The first bytes of the types a model may take as they are; WebP is RIFF....WEBP.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)
OCTET = "application/octet-stream"


def sniff(data: bytes) -> str | None:
    """The media type the first bytes of `data` announce, for the types models read (PNG,
    JPEG, GIF, WebP, PDF); None for anything else."""
    for magic, media_type in _MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def media_type_of(name: str, data: bytes, declared: str | None = None) -> str:
    """The bytes' own word first (a photo named .txt is still a photo), then the name, then
    what the sender declared (a browser's guess), else application/octet-stream."""
    found = sniff(data)
    if found:
        return found
    guessed, _ = mimetypes.guess_type(name, strict=False)
    if guessed:
        return guessed
    declared = (declared or "").split(";")[0].strip().lower()
    return declared if re.fullmatch(r"[a-z0-9.+-]+/[a-z0-9.+-]+", declared) else OCTET


def _mb(caps_mb: float) -> str:
    return f"{caps_mb:g} MB"


def too_big(name: str, size: int, caps: AttachmentCaps) -> AttachmentError:
    """The error for a file of `size` bytes over the per-file cap."""
    return AttachmentError(
        f"{name} is {size_label(size)}, over the {_mb(caps.max_file_mb)} cap per file",
        hint="Attach a smaller file, or raise [attachments] max_file_mb in config.toml.",
    )


def check_size(name: str, size: int, caps: AttachmentCaps) -> None:
    if size > caps.max_file:
        raise too_big(name, size, caps)


def from_bytes(name: str, data: bytes, caps: AttachmentCaps, declared: str | None = None) -> File:
    """An attachment from bytes in hand (a browser upload, a file sent over the control
    socket); over the per-file cap it is refused."""
    name = _clean_name(name)
    check_size(name, len(data), caps)
    return _made(name, data, media_type_of(name, data, declared))


def from_path(path: str | Path, caps: AttachmentCaps) -> File:
    """The file at `path` (a `~` is the person's home) as an attachment. The person may attach
    whatever they can read; a missing file, a folder, a file they cannot read, or one over the
    cap is an AttachmentError that says which and what to do."""
    given = str(path)
    where = Path(os.path.expanduser(given))
    try:
        info = where.stat()
    except FileNotFoundError:
        relative = "" if where.is_absolute() else f" (it is relative to {Path.cwd()})"
        raise AttachmentError(f"no file {given}", hint=f"Check the path{relative}.") from None
    except OSError as e:
        raise AttachmentError(f"cannot attach {given}: {e.strerror or e}") from None
    if stat.S_ISDIR(info.st_mode):
        raise AttachmentError(
            f"{given} is a folder", hint="Attach the files in it one by one, or an archive of it."
        )
    if not stat.S_ISREG(info.st_mode):
        raise AttachmentError(f"{given} is not a regular file", hint="Attach a file.")
    check_size(given, info.st_size, caps)
    try:
        data = where.read_bytes()
    except PermissionError:
        raise AttachmentError(
            f"cannot read {given}: permission denied", hint="Check the file's permissions."
        ) from None
    except OSError as e:
        raise AttachmentError(f"cannot read {given}: {e.strerror or e}") from None
    check_size(given, len(data), caps)  # it may have grown since the stat
    return _made(_clean_name(where.name), data, media_type_of(where.name, data))


def _made(name: str, data: bytes, media_type: str) -> File:
    pages = pdf_pages(data) if media_type == "application/pdf" else 0
    return File(media_type, data, name, pages=pages)


def without_keys(files: Sequence[File], clean: Callable[[str], str]) -> list[File]:
    """`files` with `clean` (Heron's own keys taken out) applied to every one a model reads as
    text (UTF-8 without NUL bytes): an attached config or .env carries none of them into the
    message, the store or a request. An image or a PDF is kept as it is."""
    out = []
    for file in files:
        text = _as_text(file)
        cleaned = text if text is None else clean(text)
        if cleaned == text or cleaned is None:
            out.append(file)
        else:
            out.append(_made(file.name or "file", cleaned.encode("utf-8"), file.media_type))
    return out


def _as_text(file: File) -> str | None:
    if file.data is None or sniff(file.data) or b"\x00" in file.data:
        return None
    try:
        return file.data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def pdf_pages(data: bytes) -> int:
    """How many pages the PDF `data` has; 0 (unknown) when pypdf cannot tell: a damaged file,
    or one encrypted with a password (an empty one is tried, as viewers do). Never an error:
    the file is still attached, and its estimate falls back to FILE_TOKENS. A few
    milliseconds for hundreds of pages: pypdf reads the page tree, not the pages."""
    import pypdf  # here: only a PDF attached pays for importing it

    # pypdf logs what it repairs in a damaged file ("EOF marker not found"): not the person's
    # concern, and it would land on the chat's screen.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        return len(pypdf.PdfReader(io.BytesIO(data)).pages)
    except Exception:  # pypdf raises many kinds (and worse) on bad input: any of them is unknown
        return 0


def once(files: Sequence[File]) -> list[File]:
    """Each file once, first come first kept: the same name and bytes a second time (`heron
    run -a X -a X`, `/attach X` twice) adds nothing to the message."""
    kept: list[File] = []
    for file in files:
        if file not in kept:
            kept.append(file)
    return kept


def check_total(files: Sequence[File], caps: AttachmentCaps) -> None:
    """All the files of one message within `max_turn_mb`."""
    total = sum(f.size for f in files)
    if total > caps.max_turn:
        names = ", ".join(f.name or "file" for f in files)
        raise AttachmentError(
            f"the files of this message ({names}) are {size_label(total)} together, over "
            f"the {_mb(caps.max_turn_mb)} cap per message",
            hint="Send them over several messages, or raise [attachments] max_turn_mb.",
        )


def inline_text(file: File, caps: AttachmentCaps) -> str | None:
    """The text of `file` when it goes into the message inline: UTF-8 without NUL bytes, at
    most `inline_text_kb`, and not a type models take as a file (a PDF stays a document)."""
    if file.size > caps.inline_text:
        return None
    return _as_text(file)


def fenced(name: str, text: str) -> str:
    """`text` as a fenced block under `name`; the fence is longer than any run of backticks in
    the text, so the block cannot be closed early."""
    fence = "`" * max(3, longest_backticks(text) + 1)
    return f"{name}:\n{fence}\n{text.rstrip()}\n{fence}"


def longest_backticks(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)


# The meta key of a person's message that names the text files put into it inline: for each,
# its part's index, name and size in bytes. The model reads such a file as text in the
# message; a person's screen shows it as the attachment it was (heron/web/transcript.py).
INLINE_META = "inline_files"


@dataclass
class Composed:
    """A person's message with its files: the parts, and the text files among them (by part
    index) that went in inline, as `INLINE_META` records them."""

    parts: list[Part]
    inline: list[dict[str, JSONValue]] = field(default_factory=list)

    def meta(self, meta: dict[str, Any] | None) -> dict[str, Any] | None:
        """`meta` with the inline files named in it (unchanged when there are none)."""
        if not self.inline:
            return meta
        return {**(meta or {}), INLINE_META: list(self.inline)}


def compose(text: str, files: Sequence[File], caps: AttachmentCaps) -> Composed:
    """The parts of a person's message with `files`: their text, each text file inline as a
    fenced block, then every other file as a `File` part, in the order given."""
    out = Composed([Text(text)] if text or not files else [])
    for file in files:
        body = inline_text(file, caps)
        if body is None:
            out.parts.append(file)
            continue
        name = file.name or "file"
        out.inline.append({"part": len(out.parts), "name": name, "size": file.size})
        out.parts.append(Text(("\n\n" if out.parts else "") + fenced(name, body)))
    return out


def message_parts(text: str, files: Sequence[File], caps: AttachmentCaps) -> list[Part]:
    """`compose`'s parts alone."""
    return compose(text, files, caps).parts


_FENCED = re.compile(r"\A(?:\n\n)?([^\n]+):\n(`{3,})\n(.*)\n\2\Z", re.DOTALL)


def unfenced(text: str) -> tuple[str, str] | None:
    """The name and the text of a file `compose` put inline (`fenced`, after the blank line
    that parts it from the text before it); None for any other text."""
    m = _FENCED.match(text)
    return (m.group(1), m.group(3)) if m else None


def inline_files(message: Message, meta: Mapping[str, Any]) -> dict[int, File]:
    """The text files the person attached that went into their message inline, by part index,
    each as the file it was (its text as its bytes). The row's `meta` names them
    (`INLINE_META`); a row stored before it did is read by the fenced block's shape, in a part
    after the first (the person's own text is the first, and a row of theirs holds several
    text parts only when `compose` made them). Shown as attachments by the web transcript and
    `heron conversations show`."""
    if message.role != "user":
        return {}
    parts, named = message.parts, meta.get(INLINE_META)
    if isinstance(named, list):
        wanted = {
            f["part"]: f for f in named if isinstance(f, dict) and isinstance(f.get("part"), int)
        }
    else:
        wanted = {n: {} for n in range(1, len(parts))}
    out: dict[int, File] = {}
    for n, about in wanted.items():
        part = parts[n] if 0 <= n < len(parts) else None
        found = unfenced(part.text) if isinstance(part, Text) else None
        if found is None:
            continue
        name, body = found
        data = body.encode()
        size = about.get("size")  # the file's own (the newlines at its end are not inline)
        media_type = media_type_of(name, data, "text/plain")
        out[n] = File(media_type, data, name, size=size if isinstance(size, int) else -1)
    return out


def _clean_name(name: str) -> str:
    """A file's name as the record keeps it: the last component, without control characters
    (it is shown in chips and in notes to the model)."""
    base = re.split(r"[\\/]", name)[-1]
    base = re.sub(r"[\x00-\x1f\x7f]", "", base).strip()
    return base[:200] or "file"
