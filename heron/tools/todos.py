"""The todos tool: the conversation's work list, with status, priority and the evidence that an
item is done (verified_by). It survives compaction: summaries and checkpoints re-inject it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from heron.errors import ToolError
from heron.tools.context import ToolContext
from heron.tools.registry import tool
from heron.tools.work_state import _where

if TYPE_CHECKING:
    from heron.store import Store

Status = Literal["pending", "in_progress", "done", "cancelled"]
Priority = Literal["high", "medium", "low"]


async def _apply(
    store: Store, conversation: int, add: list[str], item: int | None, changes: dict[str, Any]
) -> None:
    from heron.store import work

    try:
        await store.call(work.change_todos, store, conversation, add, item, changes)
    except LookupError as error:
        raise ToolError(str(error)) from None


@tool
async def todos(
    ctx: ToolContext,
    add: list[str] | None = None,
    item: int | None = None,
    status: Status | None = None,
    priority: Priority | None = None,
    verified_by: str | None = None,
) -> str:
    """Show, add or update todos. Mark an item done only with verified_by: the evidence.

    Args:
        add: New items (pending).
        item: The id of the item to update.
        verified_by: What shows the item is done (a test run, a file, an answer).
    """
    from heron.store import work

    store, conversation = _where(ctx)
    if status == "done" and item is not None and not verified_by:
        raise ToolError("say what verifies it (verified_by) before marking an item done")
    changes = {"status": status, "priority": priority, "verified_by": verified_by}
    if add or item is not None:
        await _apply(store, conversation, add or [], item, changes)
    items = await store.call(work.todos, store, conversation)
    lines = [
        f"#{t.id} [{t.status}] ({t.priority}) {t.text}"
        + (f" — verified by: {t.verified_by}" if t.verified_by else "")
        for t in items
    ]
    return "\n".join(lines) or "No todos."
