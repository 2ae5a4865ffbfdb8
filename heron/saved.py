"""Text too large for the model's context, kept whole in the workspace: a tool result over its
budget (when the registry cuts it, or later when the view does) and a user message over its
share. One way to name and write such a file, so the pointer the model reads leads to the text.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path

RESULTS_DIR = Path(".heron") / "results"
MESSAGES_DIR = Path(".heron") / "messages"


def keep(name: str, text: str, workspace: Path | None, folder: Path = RESULTS_DIR) -> str | None:
    """Where `text` is kept: `folder/<name>-<digest>.txt`, relative to the workspace (the
    digest because call ids repeat on some servers; the same text is written once); under the
    temp folder, as an absolute path, when the workspace takes no file (read-only); None without
    a workspace or when nowhere takes it."""
    if workspace is None:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "result"
    digest = hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:10]
    relative = folder / f"{safe}-{digest}.txt"
    outside = Path(tempfile.gettempdir()) / "heron-results" / relative.name
    for target, shown in ((workspace / relative, str(relative)), (outside, str(outside))):
        try:
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8", errors="replace")
        except OSError:
            continue
        return shown
    return None


def head(text: str, limit: int) -> str:
    """The first `limit` characters, ending on a whole line when one ends near the limit."""
    shown = text[:limit]
    cut = shown.rfind("\n")
    return shown[:cut] if cut > limit * 0.8 else shown
