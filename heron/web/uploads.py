"""Files the browser uploads before it sends the message that carries them.

`POST /api/uploads` (heron/serve/api.py) keeps each file under `HERON_HOME/uploads/` as
`<id>.bin` with its name and type in `<id>.json`; a `send` then names them by `upload_id`
(docs/web.md) and `uploaded_files` turns them into the `File` parts of the user's message.
An upload lasts until a message takes it (its bytes are then the message's, kept once under
`HERON_HOME/files/`) or for `KEPT_S` at most: one never sent (a tab closed with a chip in its
composer) is removed by the next upload, so repeated uploads do not fill the disk.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from heron.attachments import check_total, from_bytes
from heron.config import AttachmentCaps
from heron.errors import AttachmentError
from heron.messages import File


class UploadError(AttachmentError):
    """A `send` names an upload that is not there, or its files pass the per-message cap."""


@dataclass(frozen=True)
class Upload:
    """One uploaded file, as `POST /api/uploads` answers it."""

    upload_id: str
    name: str
    mime: str
    size: int


def folder(home: Path) -> Path:
    found = home / "uploads"
    found.mkdir(parents=True, exist_ok=True)
    return found


# Seconds an upload no message took is kept: a day, past any composer left open overnight.
KEPT_S = 24 * 3600


def save(home: Path, upload: Upload, data: bytes) -> None:
    where = folder(home)
    prune(where, time.time() - KEPT_S)
    (where / f"{upload.upload_id}.bin").write_bytes(data)
    (where / f"{upload.upload_id}.json").write_text(json.dumps(asdict(upload)))


def prune(where: Path, before: float) -> None:
    """Remove the uploads written before `before` (epoch seconds) that no message took."""
    for path in where.iterdir():
        with contextlib.suppress(OSError):  # another request removed it first
            if path.stat().st_mtime < before:
                path.unlink()


def _taken(home: Path, upload_id: str) -> None:
    """A message took the upload: its bytes are the message's now."""
    for suffix in (".bin", ".json"):
        with contextlib.suppress(OSError):
            (home / "uploads" / f"{upload_id}{suffix}").unlink()


def load_upload(home: Path, upload_id: str) -> tuple[Upload, bytes] | None:
    """An upload by id (None when there is no such upload)."""
    if not re.fullmatch(r"[0-9a-f]{24}", upload_id):
        return None
    folder = home / "uploads"
    meta, body = folder / f"{upload_id}.json", folder / f"{upload_id}.bin"
    if not meta.exists() or not body.exists():
        return None
    return Upload(**json.loads(meta.read_text())), body.read_bytes()


def uploaded_files(home: Path, refs: Any, caps: AttachmentCaps) -> tuple[File, ...]:
    """The `File` parts for a `send`'s `files` ([{name, mime, upload_id}], docs/web.md), in
    order, made by heron/attachments.py's rules (the type from the bytes, the caps of
    `[attachments]`); an unknown upload or files over the caps are refused with a clear error,
    so nothing is sent half attached. The turn then puts a text file inline and keeps the
    others as files (`attachments.message_parts`)."""
    if not isinstance(refs, list):
        raise UploadError("files must be a list of uploads", hint="Upload each file first.")
    found: list[File] = []
    ids: list[str] = []
    for ref in refs:
        upload_id = str(ref.get("upload_id", "")) if isinstance(ref, dict) else ""
        ids.append(upload_id)
        got = load_upload(home, upload_id)
        if got is None:
            raise UploadError(
                f"no upload {upload_id!r}", hint="Attach the file again: uploads do not last."
            )
        upload, data = got
        found.append(from_bytes(upload.name, data, caps, upload.mime))
    check_total(found, caps)  # refused: the uploads stay, for the send tried again
    for upload_id in ids:
        _taken(home, upload_id)
    return tuple(found)
