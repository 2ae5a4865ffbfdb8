"""The work_state tool: the agent's own account of the work, one JSON document per
conversation. It survives compaction: every summary and checkpoint re-injects it."""

from __future__ import annotations

import json

from heron.errors import ToolError
from heron.store import Store
from heron.tools.context import ToolContext
from heron.tools.registry import tool

FIELDS = ("goal", "constraints", "decisions", "open_questions", "next_step")


def _where(ctx: ToolContext) -> tuple[Store, int]:
    store, conversation = ctx.services.store, ctx.services.conversation_id
    if store is None or conversation is None:
        raise ToolError("work state is not available in this run (no conversation)")
    return store, conversation


@tool
async def work_state(
    ctx: ToolContext,
    goal: str | None = None,
    constraints: list[str] | None = None,
    decisions: list[str] | None = None,
    open_questions: list[str] | None = None,
    next_step: str | None = None,
    clear: bool = False,
) -> str:
    """Read or update the work state (goal, constraints, decisions, open questions, next step).
    Given fields replace the stored ones; with none, it is returned. It survives compaction.

    Args:
        clear: Discard the work state (the work is over).
    """
    from heron.store import work

    store, conversation = _where(ctx)
    state = {} if clear else await store.call(work.work_state, store, conversation)
    given = dict(
        zip(FIELDS, (goal, constraints, decisions, open_questions, next_step), strict=True)
    )
    state.update({k: v for k, v in given.items() if v is not None})
    if clear or any(v is not None for v in given.values()):
        await store.call(work.set_work_state, store, conversation, state)
    return json.dumps(state, ensure_ascii=False, indent=1) if state else "No work state."
