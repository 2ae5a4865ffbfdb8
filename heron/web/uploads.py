"""Files the browser uploads before it sends the message that carries them.

`POST /api/uploads` (heron/serve/api.py) keeps each file under `HERON_HOME/uploads/` as
`<id>.bin` with its name and type in `<id>.json`; a `send` then names them by `upload_id`
(docs/web.md) and `uploaded_files` turns them into the `File` parts of the user's message.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from heron.errors import HeronError
from heron.messages import File

UPLOAD_CAP = 20 * 1024 * 1024  # bytes per file (issue 15)
TURN_CAP = 50 * 1024 * 1024  # bytes of attachments per message


class UploadError(HeronError):
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


def save(home: Path, upload: Upload, data: bytes) -> None:
    where = folder(home)
    (where / f"{upload.upload_id}.bin").write_bytes(data)
    (where / f"{upload.upload_id}.json").write_text(json.dumps(asdict(upload)))


def load_upload(home: Path, upload_id: str) -> tuple[Upload, bytes] | None:
    """An upload by id (None when there is no such upload)."""
    if not re.fullmatch(r"[0-9a-f]{24}", upload_id):
        return None
    folder = home / "uploads"
    meta, body = folder / f"{upload_id}.json", folder / f"{upload_id}.bin"
    if not meta.exists() or not body.exists():
        return None
    return Upload(**json.loads(meta.read_text())), body.read_bytes()


def uploaded_files(home: Path, refs: Any) -> tuple[File, ...]:
    """The `File` parts for a `send`'s `files` ([{name, mime, upload_id}], protocol.md), in
    order; an unknown upload or one over the caps is refused with a clear error, so nothing is
    sent half attached. The turn wiring is one call: the serve's session passes these to the
    user's message (`InboundMessage.files`, heron/attachments.py on the terminal branch), which
    decides by the bytes what each model receives."""
    if not isinstance(refs, list):
        raise UploadError("files must be a list of uploads", hint="Upload each file first.")
    found: list[File] = []
    total = 0
    for ref in refs:
        upload_id = str(ref.get("upload_id", "")) if isinstance(ref, dict) else ""
        got = load_upload(home, upload_id)
        if got is None:
            raise UploadError(
                f"no upload {upload_id!r}", hint="Attach the file again: uploads do not last."
            )
        upload, data = got
        total += len(data)
        if total > TURN_CAP:
            raise UploadError(
                f"the files of this message pass {TURN_CAP // (1024 * 1024)} MB",
                hint="Send them over several messages.",
            )
        found.append(File(upload.mime, data, upload.name))
    return tuple(found)
