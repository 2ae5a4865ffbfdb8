"""The proactive work a turn can start, attached to an AgentLoop in one call: subagents (the
`spawn` tool), questions that wait (`ask_user`) and sustained goals (`/goal`, the `goal` tool).

Every process that runs a person's turns attaches them the same way: `heron chat` and
`heron run` without a serve (heron/channels/inprocess.py) and `heron serve`
(heron/serve/runtime.py). The serve's workers (heron/scale/) do not: a subagent manager's start
interrupts the runs no live process owns, which on several workers would be another worker's
(docs/scale.md, "Not yet").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from heron.proactive import ask, goals, subagents

if TYPE_CHECKING:
    from heron.agent.loop import AgentLoop
    from heron.tools.registry import Tool, ToolRegistry

# The tools `attach` adds to the engine's registry, in the order it adds them: a run's tool
# list ends with them, and `heron trace replay` rebuilds it with `replay_registry`.
TOOLS: tuple[Tool, ...] = (subagents.spawn, ask.ask_user, goals.goal)


@dataclass
class Proactive:
    """What was attached to one loop; `start` after the loop runs, `close` before it closes."""

    subagents: subagents.Subagents
    asks: ask.Asks
    goals: goals.Goals

    async def start(self, *, announce: bool = True) -> None:
        """Subagent runs a dead process left open are interrupted; with `announce`, results
        still owed (by this or an earlier process) are announced in their conversations."""
        await self.subagents.start(announce=announce)

    async def close(self) -> None:
        """Running subagents stopped and recorded interrupted (announced at the next start)."""
        await self.subagents.close()


def attach(loop: AgentLoop, *, channel: tuple[str, str] | None = None) -> Proactive:
    """Subagents, questions and goals for `loop`. `channel` is the (channel, chat) under which
    a result owed by an earlier process is announced when its conversation has not been heard
    from here yet: the one chat of a heron chat or heron run; Heron's own for a serve, whose hub
    takes every conversation's output whatever channel it names (None: the channel and chat
    the result was spawned from)."""
    return Proactive(
        subagents.attach(loop, channel=channel),
        ask.attach(loop),  # the next message in the conversation answers a waiting question
        goals.attach(loop),  # nudge turns until done, parked at budget
    )


def replay_registry() -> ToolRegistry:
    """The tools a person's run had (the engine's, then `TOOLS`), for a replay of it."""
    from heron.agent.replay import engine_registry

    return engine_registry(TOOLS)


async def settle(loop: AgentLoop, manager: subagents.Subagents | None) -> None:
    """Until no turn runs or waits, no subagent works (its result's announce turn included)
    and everything the turns sent has been delivered (tests, the benches)."""
    while True:
        await loop.bus.inbound.join()
        await loop.wait_idle()
        if manager is None or not manager.busy:
            break
        await manager.settle()  # its result's announce turn, then idle again
    await loop.bus.outbound.join()
