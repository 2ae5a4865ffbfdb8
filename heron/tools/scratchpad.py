"""The scratchpad tool: durable scratch space per agent, across its conversations, for drafts
and dumps too big or too provisional for memory. Bounded so a runaway agent cannot fill the
disk: a write over a bound is refused with an error the model reads; nothing is dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from heron.errors import ToolError
from heron.tools.context import ToolContext
from heron.tools.registry import in_thread, tool


def root_of(ctx: ToolContext) -> Path:
    if ctx.scratchpad is not None:
        return ctx.scratchpad
    return ctx.workspace.parent / "scratchpad" / ctx.services.agent


def _target(root: Path, name: str) -> Path:
    target = (root / name).resolve()
    if not name or not target.is_relative_to(root.resolve()) or target == root.resolve():
        raise ToolError(f"{name!r} is not a file name inside the scratchpad")
    return target


def _usage(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def _write(root: Path, name: str, text: str, append: bool, limits: tuple[int, int, int]) -> str:
    max_file, max_files, max_total = limits
    target = _target(root, name)
    data = text.encode()
    old = target.stat().st_size if target.exists() else 0
    size = old + len(data) if append else len(data)
    count, total = _usage(root) if root.exists() else (0, 0)
    if size > max_file:
        raise ToolError(f"{name} would be {size} bytes; a scratchpad file holds {max_file}")
    if not target.exists() and count + 1 > max_files:
        raise ToolError(f"the scratchpad holds {max_files} files; delete some first")
    if total - old + size > max_total:
        raise ToolError(f"the scratchpad would exceed {max_total} bytes; delete some first")
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("ab" if append else "wb") as f:
        f.write(data)
    return f"Saved {name} ({size} bytes) in the scratchpad."


def _run(ctx: ToolContext, action: str, name: str, text: str) -> str:
    root = root_of(ctx)
    if action in ("write", "append"):
        return _write(root, name, text, action == "append", ctx.scratchpad_limits)
    if action == "read":
        target = _target(root, name)
        if not target.is_file():
            raise ToolError(f"no scratchpad file {name!r}")
        return target.read_text(encoding="utf-8", errors="replace")
    if action == "delete":
        _target(root, name).unlink(missing_ok=True)
        return f"Deleted {name}."
    files = (
        sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        if root.exists()
        else []
    )
    return "\n".join(files) or "The scratchpad is empty."


@tool
async def scratchpad(
    ctx: ToolContext,
    action: Literal["list", "read", "write", "append", "delete"],
    name: str = "",
    text: str = "",
) -> str:
    """Your durable scratch space across conversations, for large drafts and notes.

    Args:
        name: File name inside the scratchpad.
        text: What to write or append.
    """
    return await in_thread(_run, ctx, action, name, text)
