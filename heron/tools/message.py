"""The `message` tool: the agent speaks to the user in the middle of a turn.

In an ordinary conversation the final answer is delivered anyway, so the tool matters for
internal work (a scheduled job, a subagent's report), which is silent unless the agent decides
the user must hear something. A turn that used it ends as SPOKE_VIA_TOOL and its final answer is
not sent a second time. The turn hands its control to the tools as `ctx.services.turn`; the tool
uses its `deliver` outlet and `spoke` list (`RunningTurn`, heron/tools/context.py). Background
work's message is also kept in the conversation it goes to (heron/agent/relay.py); the outlet
then says what the tool answers: whether anyone saw it now, and where it is kept.
"""

from __future__ import annotations

from heron.tools.context import ToolContext
from heron.tools.registry import ToolOutput, ToolRegistry, tool


@tool
async def message(ctx: ToolContext, text: str) -> str | ToolOutput:
    """Send a message to the user right now, on the channel of this conversation.

    Use it when the user must hear something before the turn ends, or from background work,
    which the user does not see otherwise. Your final reply is delivered without it.

    Args:
        text: What to tell the user (Markdown).
    """
    turn = ctx.services.turn
    if turn is None or turn.deliver is None:
        return ToolOutput("No channel to deliver to in this run; put it in your reply.", True)
    if turn.stale:
        return ToolOutput("The turn was stopped; nothing was sent.", True)
    answer = await turn.deliver(text)
    turn.spoke.append(text)
    return answer or "Delivered to the user."


def with_message_tool(registry: ToolRegistry) -> ToolRegistry:
    """The registry for channel turns: the given tools plus `message`."""
    registry.add(message)
    return registry
