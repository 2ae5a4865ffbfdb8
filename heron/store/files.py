"""The bytes of attachments, content-addressed beside the database.

A `File` part's row holds its name, type, size and sha256 (heron/messages.py); its bytes live
here as `<folder>/<first two hex digits>/<sha256>`, written once (a second attachment of the same
file costs nothing) and atomically (a temporary file renamed into place, so a crash leaves either
the whole file or none). A store in memory keeps them in a dict. Nothing here is ever deleted by
Heron: a deleted conversation may share a file with another one.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from heron.errors import StoreError
from heron.messages import File, Message, Part

_SHA = re.compile(r"[0-9a-f]{64}")


class FileStore:
    """Where a store keeps attachment bytes: a folder, or (`folder` None) memory."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._memory: dict[str, bytes] = {}

    def path(self, sha256: str) -> Path | None:
        """Where the bytes of `sha256` are (or would be) kept; None in memory or for a name
        that is not a sha256 (a damaged row must not name a path outside the folder)."""
        if self.folder is None or not _SHA.fullmatch(sha256):
            return None
        return self.folder / sha256[:2] / sha256

    def keep(self, parts: Iterable[Part]) -> None:
        """Write the bytes of every loaded `File` in `parts` that is not kept yet."""
        for part in parts:
            if isinstance(part, File) and part.data is not None:
                self._keep(part.sha256, part.data)

    def _keep(self, sha256: str, data: bytes) -> None:
        if self.folder is None:
            self._memory.setdefault(sha256, data)
            return
        target = self.path(sha256)
        if target is None or hashlib.sha256(data).hexdigest() != sha256:
            raise StoreError(f"a file part's sha256 {sha256[:16]}… does not match its bytes")
        if target.exists():
            return
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            raise StoreError(
                f"cannot keep an attachment in {self.folder}: {e.strerror or e}",
                hint="Free some disk space or fix the folder's permissions, then send again.",
            ) from e

    def read(self, sha256: str) -> bytes | None:
        """The bytes of `sha256`; None when they are not kept (deleted by hand, damaged)."""
        if self.folder is None:
            return self._memory.get(sha256)
        where = self.path(sha256)
        if where is None:
            return None
        try:
            data = where.read_bytes()
        except OSError:
            return None
        return data if hashlib.sha256(data).hexdigest() == sha256 else None

    def load(self, part: File) -> File:
        """`part` with its bytes, when it has none and they are kept; else `part` itself."""
        if part.data is not None:
            return part
        data = self.read(part.sha256)
        return part if data is None else part.with_data(data)

    def load_messages(self, messages: Sequence[Message]) -> list[Message]:
        """`messages` with the bytes of their `File` parts loaded (each file read once); a
        message without unloaded files is the same object, so what is cached stays shared."""
        read: dict[str, bytes | None] = {}
        out: list[Message] = []
        for message in messages:
            if not any(isinstance(p, File) and p.data is None for p in message.parts):
                out.append(message)
                continue
            parts: list[Part] = []
            for p in message.parts:
                if isinstance(p, File) and p.data is None:
                    if p.sha256 not in read:
                        read[p.sha256] = self.read(p.sha256)
                    data = read[p.sha256]
                    parts.append(p if data is None else p.with_data(data))
                else:
                    parts.append(p)
            out.append(Message(message.role, parts))
        return out
