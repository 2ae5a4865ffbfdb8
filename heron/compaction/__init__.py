"""Compaction: keeping a conversation inside the model's window without losing what was said.

Entry points for the engine:

- `prepare_turn(engine, conversation, agent, turn_id, user_row_id)`: before a turn's first call,
  consolidate when the conversation passed window x consolidation ratio; returns the system
  prompt, the view, and the `Governor` whose `govern` the runner calls before every call.
- `compact_now(engine, conversation, reason=..., window=...) -> str`: /compact, and the
  recovery from a provider's context overflow.
- `compact_idle(engine)` / `idle_loop(engine)`: idle compaction in the background.

Imports are lazy so `import heron.compaction` stays cheap for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heron.compaction.consolidate import CompactionReport
    from heron.compaction.core import CompactionHost
    from heron.compaction.idle import Quiet
    from heron.compaction.prepare import Prepared


async def prepare_turn(
    engine: CompactionHost,
    conversation: Any,
    agent: str,
    turn_id: int,
    user_row_id: int,
    *,
    window: int | None = None,
    heavy: bool = False,
    on_call: Any = None,
) -> Prepared:
    """`on_call` receives every model call compaction makes for the turn (its trace);
    `heavy`: the turn brings files, so its view is derived off the loop."""
    from heron.compaction.prepare import prepare_turn as run

    return await run(
        engine,
        conversation,
        agent,
        turn_id,
        user_row_id,
        window=window,
        heavy=heavy,
        on_call=on_call,
    )


def memory_tokens(engine: CompactionHost) -> int:
    """The memory section's budget in the prompt: [context] memory of the window."""
    from heron.compaction.core import window_for

    setup = engine.compaction_setup()
    return int(window_for(setup) * setup.context.memory)


async def compact_conversation(
    engine: CompactionHost,
    conversation: Any,
    *,
    reason: str = "manual",
    window: int | None = None,
    on_call: Any = None,
) -> CompactionReport:
    """Consolidate now, whatever the size (keeping the last messages verbatim)."""
    from heron.compaction.consolidate import consolidate
    from heron.compaction.core import deps_for

    deps = deps_for(engine, window)
    deps.on_call = on_call
    return await consolidate(deps, conversation.id, conversation.agent, reason=reason)


async def compact_now(
    engine: CompactionHost,
    conversation: Any,
    *,
    reason: str = "manual",
    window: int | None = None,
    on_call: Any = None,
) -> str:
    """/compact and context-overflow recovery: what was done, in one sentence."""
    report = await compact_conversation(
        engine, conversation, reason=reason, window=window, on_call=on_call
    )
    return report.describe()


async def compact_idle(
    engine: CompactionHost, now: float | None = None, quiet: Quiet | None = None
) -> list[CompactionReport]:
    from heron.compaction.idle import compact_idle as run

    return await run(engine, now, quiet)


async def idle_loop(
    engine: CompactionHost, poll_s: float = 60.0, quiet: Quiet | None = None
) -> None:
    from heron.compaction.idle import idle_loop as run

    await run(engine, poll_s, quiet)


__all__ = [
    "compact_conversation",
    "compact_idle",
    "compact_now",
    "idle_loop",
    "memory_tokens",
    "prepare_turn",
]
