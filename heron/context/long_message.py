"""A user message larger than its share of the window (`[context] user_message`): what the model
sees of it, and what the person is told once.

The record keeps the message whole. The view (heron/context/view.py) shows each part over its
allotment by its head and tail and names a file in the workspace that holds all of it, which the
model can open with its tools. The parts counted are what the person wrote (the runtime block
aside) and every attached text file the model would get as text (`file_class` "text" in
heron/providers/wire.py): a text file over `[attachments] inline_text_kb` stays a `File` part
in the record, and unlike an image it goes to the model as its text, so it is cut the way a
pasted message is. The share is the whole message's: parts that fit in an even split keep
their size, and what they leave is split evenly among the larger ones.

A PDF whose pages were counted is measured by its estimate (heron/context/tokens.py, in
characters as the share is), but it cannot be cut: it goes whole or not at all, against a share
of its own, PDF_SHARE times the message's (half the window by default), smallest first. One
that does not fit is not sent; the model gets a note with its page count and a copy saved in
the workspace to read with its tools, and the person is told once, as for a text file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from heron import workspace_io
from heron.context.runtime import is_runtime_part
from heron.context.tokens import estimate_text, file_tokens
from heron.messages import File, Message, Part, Text, decode_text, file_class, size_label
from heron.saved import MESSAGES_DIR, keep, keep_bytes

# sha256 -> the bytes the store keeps of an attachment, None when they are gone
FileReader = Callable[[str], bytes | None]


def message_file(text: str, workspace: Path | None) -> str | None:
    """Where a user message too large for the view is saved (relative to the workspace)."""
    return keep("message", text, workspace, MESSAGES_DIR)


def large_user_text(
    text: str, limit: int, workspace: Path | None, row_id: int | None = None
) -> str:
    """A user message over its share: its head and tail and the file that holds all of it
    (the record keeps it whole too). Same text, same bytes: the file is named by its digest."""
    if len(text) <= limit:
        return text
    path = message_file(text, workspace)
    head, tail = text[: limit * 2 // 3], text[-(limit // 3) :]
    where = f" The whole message is saved in {path}: read it with read_file." if path else ""
    if row_id is not None:
        where += f" It is message [#{row_id}] for recall_history."
    note = (
        f"\n[... {len(text) - len(head) - len(tail):,} characters of this message left out of"
        f" the context ({len(text):,} in all).{where} Its end follows.]\n"
    )
    return head + note + tail


def counted(part: Part) -> int | None:
    """A part's size against the share, in characters (a text file's bytes, which are at
    least its characters); None for a part the share does not cover."""
    if isinstance(part, Text):
        return None if is_runtime_part(part) else len(part.text)
    if isinstance(part, File) and file_class(part) == "text":
        return part.size
    if _whole(part):
        return file_tokens(part) * 4  # the share is counted in characters, four a token
    return None


def _whole(part: Part) -> TypeGuard[File]:
    """A PDF of known pages: in the share, but sent whole or not at all."""
    return isinstance(part, File) and file_class(part) == "pdf" and part.pages > 0


def _rough_size(message: Message) -> int:
    """At least the counted size: every text part, the runtime block included."""
    total = 0
    for part in message.parts:
        if isinstance(part, Text):
            total += len(part.text)
        elif isinstance(part, File):
            total += counted(part) or part.size
    return total


def allotments(message: Message, limit: int) -> dict[int, int]:
    """The parts of a user message over their allotment of `limit` characters: part index ->
    the characters it may show. Empty when the whole message fits (nothing is read)."""
    if message.role != "user" or _rough_size(message) <= limit:
        return {}  # the common case, once per user message and view: no runtime-block test
    sizes = {i: n for i, p in enumerate(message.parts) if (n := counted(p)) is not None}
    if sum(sizes.values()) <= limit:
        return {}
    pdfs = {i: n for i, n in sizes.items() if _whole(message.parts[i])}
    rest = {i: n for i, n in sizes.items() if i not in pdfs}
    out = _whole_or_none(pdfs, PDF_SHARE * limit) | _even_split(rest, limit)
    return {i: allot for i, allot in out.items() if sizes[i] > allot}


# A PDF may take twice the message's share (half the window by default): it cannot be cut, and
# a paper of a few dozen pages is what people attach to ask about. Its estimate errs high.
PDF_SHARE = 2


def _whole_or_none(sizes: dict[int, int], limit: int) -> dict[int, int]:
    """Smallest first, each part whole while the parts so far fit in `limit`, else nothing."""
    out: dict[int, int] = {}
    left = limit
    for i in sorted(sizes, key=lambda i: sizes[i]):
        out[i] = sizes[i] if sizes[i] <= left else 0
        left -= out[i]
    return out


def _even_split(sizes: dict[int, int], limit: int) -> dict[int, int]:
    """Parts that fit in an even split of `limit` keep their size; what they leave is split
    evenly among the larger ones."""
    out: dict[int, int] = {}
    left, order = limit, sorted(sizes, key=lambda i: sizes[i])
    for n, i in enumerate(order):
        out[i] = min(sizes[i], left // (len(order) - n))
        left -= out[i]
    return out


@dataclass(frozen=True)
class FileExcerpt:
    """What the model sees of a text file over its allotment, and what the person is told."""

    part: Text
    head: int
    tail: int
    path: str | None  # where the whole text is saved, relative to the workspace


# Each turn derives the view again; a file read, decoded and saved once serves the next turns.
_EXCERPTS: OrderedDict[tuple[str, str | None, int, Path | None], FileExcerpt | None] = OrderedDict()
_KEPT = 8


def file_excerpt(
    part: File, limit: int, workspace: Path | None, read: FileReader | None
) -> FileExcerpt | None:
    """The head and tail of an attached text file over `limit` characters, and the file in the
    workspace that holds its whole text; None when it fits or its bytes cannot be read."""
    key = (part.sha256, part.name, limit, workspace)
    if key in _EXCERPTS and _still_saved(_EXCERPTS[key], workspace):
        _EXCERPTS.move_to_end(key)
        return _EXCERPTS[key]
    data = part.data if part.data is not None else read(part.sha256) if read else None
    if data is None:
        return None  # not remembered: a reader given later may find the bytes
    found = _excerpt(part, decode_text(data)[0], limit, workspace)
    _EXCERPTS[key] = found
    if len(_EXCERPTS) > _KEPT:
        _EXCERPTS.popitem(last=False)
    return found


def _still_saved(found: FileExcerpt | None, workspace: Path | None) -> bool:
    """Whether the copy an excerpt names is still there (the agent may have deleted it)."""
    if found is None or found.path is None:
        return True
    if workspace is None:
        return Path(found.path).exists()
    return workspace_io.is_file(workspace, found.path)


def _excerpt(part: File, text: str, limit: int, workspace: Path | None) -> FileExcerpt | None:
    if len(text) <= limit:
        return None
    name = part.name or "file"
    path = keep(name, text, workspace, MESSAGES_DIR)
    head, tail = text[: limit * 2 // 3], text[-(limit // 3) :]
    where = f" The whole file is saved in {path}: read it with read_file." if path else ""
    intro = (
        f"[Attached file {name} ({size_label(part.size)}, {len(text):,} characters) is larger"
        f" than its share of the context: its first {len(head):,} and last {len(tail):,}"
        f" characters follow.{where}]\n"
    )
    gap = (
        f"\n[... {len(text) - len(head) - len(tail):,} characters of {name} left out of the"
        " context. Its end follows.]\n"
    )
    body = Text(intro + head + gap + tail)
    return FileExcerpt(body, len(head), len(tail), path)


def shown(
    message: Message,
    limit: int | None,
    workspace: Path | None,
    read: FileReader | None = None,
    row_id: int | None = None,
) -> Message:
    """`message` as the view shows it: every part within its allotment of the share."""
    if limit is None or message.role != "user":
        return message
    cuts = allotments(message, limit)
    if not cuts:
        return message
    parts = list(message.parts)
    for i, allot in cuts.items():
        part = parts[i]
        if isinstance(part, Text):
            parts[i] = Text(large_user_text(part.text, allot, workspace, row_id))
        elif _whole(part):
            parts[i] = Text(_pdf_note(part, saved_pdf(part, workspace, read)))
        elif isinstance(part, File):
            found = file_excerpt(part, allot, workspace, read)
            parts[i] = found.part if found else part
    return Message(message.role, parts)


def saved_pdf(part: File, workspace: Path | None, read: FileReader | None) -> str | None:
    """Where the workspace holds a copy of a PDF too large to send (written once, from the
    store's copy of its bytes); None without a workspace or the bytes."""

    def data() -> bytes | None:
        return part.data if part.data is not None else read(part.sha256) if read else None

    return keep_bytes(part.name or "file.pdf", part.sha256, data, workspace, MESSAGES_DIR, ".pdf")


def _pdf_note(part: File, path: str | None) -> str:
    name = part.name or "file.pdf"
    where = (
        f" The whole file is saved in {path}: read the pages you need with your tools"
        " (pypdf in run_cell)."
        if path
        else " Ask for fewer pages at a time."
    )
    return (
        f"[Attached PDF {name} ({size_label(part.size)}, {part.pages:,} pages, about"
        f" {file_tokens(part):,} tokens) is larger than its share of the context: it is not"
        f" sent.{where}]"
    )


def notices(
    message: Message,
    limit: int,
    workspace: Path | None,
    read: FileReader | None,
    tokens: Callable[[int], int],
) -> list[str]:
    """What the person is told of the parts of their message over the share (once, by the
    turn that brings it); `tokens` turns a raw estimate into the model's."""
    out = []
    for i, allot in allotments(message, limit).items():
        part = message.parts[i]
        if isinstance(part, Text):
            path = message_file(part.text, workspace) or "the record"
            out.append(
                f"Your message is about {tokens(estimate_text(part.text)):,} tokens, more than"
                f" its share of the model's window: the model sees its first {allot * 2 // 3:,}"
                f" and last {allot // 3:,} characters and can read the rest from {path}."
                " The whole message is kept."
            )
        elif _whole(part):
            saved = saved_pdf(part, workspace, read)
            out.append(
                f"{part.name or 'The attached PDF'} has {part.pages:,} pages, about"
                f" {tokens(file_tokens(part)):,} tokens, more than its share of the model's"
                " window: the model gets a note in its place"
                + (f" and can read it from {saved}" if saved else "")
                + ". The whole file is kept. To send it as a document, attach fewer pages"
                " (split the PDF), use a model with a larger window, or raise [context]"
                " user_message."
            )
        elif isinstance(part, File) and (found := file_excerpt(part, allot, workspace, read)):
            out.append(
                f"{part.name or 'The attached file'} is about {tokens(file_tokens(part)):,} tokens,"
                f" more than its share of the model's window: the model sees its first"
                f" {found.head:,} and last {found.tail:,} characters and can read the rest from"
                f" {found.path or 'the record'}. The whole file is kept."
            )
    return out
