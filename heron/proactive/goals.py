"""Sustained goals: `/goal TEXT` (or the `goal` tool) keeps the agent working across turns.

The objective goes into the runtime block (after the user's message, where it does not break
the cached prefix) in full once, then as one line saying it is unchanged. A turn of a
conversation with an active goal has no wall-clock model deadline. When a turn there ends with
the goal still open, the loop continues it with a nudge turn, until the agent marks it done
with evidence (`goal(action="done", evidence=...)`), the person ends it (`/goal done|stop`),
or its budget of nudge turns and tokens runs out: then it is parked and the person told, in a
note kept in the conversation as Heron's row (heron/agent/relay.py), since the person who set a
goal is often not watching when it parks; a failed nudge is told the same way.
Whatever the person sends goes first: no nudge starts while their message waits, and a
conversation whose subagent still works is neither nudged nor parked (its result's turn
picks the work up).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from heron.agent.commands import CommandContext, CommandReply
from heron.bus import InboundMessage, OutboundMessage, TurnOptions
from heron.messages import plural
from heron.store import goals, runs, waiting
from heron.tools.context import PERSONAL, ToolContext
from heron.tools.registry import ToolOutput, tool

if TYPE_CHECKING:
    from heron.agent.loop import AgentLoop, TurnEnded
    from heron.store import Store

NUDGE = (
    "[Heron: your goal continues] Keep working toward the goal in the runtime block. When it "
    'is met, call goal(action="done", evidence=...) with what shows it; if you are blocked or '
    "need the user, say what you need."
)
# Who said a goal's notes kept in its conversation (the label the model reads them with).
GOAL_WHO = "Heron (this conversation's goal)"
USAGE = (
    "/goal shows the goal; /goal TEXT sets one; /goal done or /goal stop ends it; "
    "/goal budget TURNS [TOKENS] gives it a new budget (and continues a parked one)."
)


def runtime_note(store: Store, key: str) -> str | None:
    """The goal's line of the runtime block: the objective in full the first time (and after
    it changes), then that it is unchanged."""
    goal = goals.open_goal(store, key)
    if goal is None or goal.status != "active":
        return None
    if goal.shown != goal.objective:
        goals.mark_shown(store, goal.id, goal.objective)
        return (
            "Goal (sustained, keep working on it across turns; when it is met, call goal with "
            f'action "done" and the evidence): {goal.objective}'
        )
    return f"Goal: unchanged ({goal.budget()} of continuing)."


def describe(goal: goals.Goal | None) -> str:
    if goal is None:
        return "No goal in this conversation. /goal TEXT sets one."
    state = "parked, its budget ran out" if goal.status == "parked" else goal.status
    return f"Goal ({state}; {goal.budget()}): {goal.objective}"


def goal_command(store: Store, key: str, arg: str) -> str:
    """/goal [TEXT | done | stop | budget TURNS [TOKENS]]."""
    word, _, rest = arg.partition(" ")
    if not arg:
        return describe(goals.open_goal(store, key))
    if word in ("done", "stop") and not rest:
        ended = goals.end_goal(store, key, "done" if word == "done" else "stopped", "by the user")
        return "No goal to end." if ended is None else f"Goal ended ({word}): {ended.objective}"
    if word == "budget":
        return _budget(store, key, rest)
    before = goals.open_goal(store, key)
    goal = goals.set_goal(store, key, arg)
    said = f"Goal set ({goal.budget()}): {goal.objective}\n"
    if before is not None:  # replaced, never silently
        said += f"The previous goal was stopped and replaced: {before.objective}\n"
    return f"{said}Working on it; {USAGE}"


async def _goal(ctx: CommandContext, arg: str) -> CommandReply:
    """The /goal command, added to the engine's commands by `attach`."""
    return CommandReply(await ctx.store.call(goal_command, ctx.store, ctx.key, arg))


def _budget(store: Store, key: str, rest: str) -> str:
    goal = goals.open_goal(store, key)
    if goal is None:
        return "No goal to budget. /goal TEXT sets one."
    numbers = rest.replace(",", "").replace("_", "").split()
    if not numbers or not all(n.isdigit() and int(n) > 0 for n in numbers) or len(numbers) > 2:
        return f"Give the budget as whole numbers above 0: /goal budget TURNS [TOKENS]. {USAGE}"
    turns = int(numbers[0])
    tokens = int(numbers[1]) if len(numbers) > 1 else goal.max_tokens
    goals.set_budget(store, goal.id, turns, tokens)
    budget = f"{plural(turns, 'turn')}, {plural(tokens, 'token')}"
    return f"Goal budget: {budget} from now: {goal.objective}"


@dataclass
class Goals:
    """Goals of one AgentLoop: turn options, the runtime line and the nudges."""

    loop: AgentLoop

    @property
    def store(self) -> Store:
        return self.loop.engine.store

    def options_for(self, key: str, message: InboundMessage) -> TurnOptions | None:
        """A turn in a conversation with an active goal has no wall-clock model deadline."""
        goal = goals.open_goal(self.store, key)  # one indexed row: fine on the loop
        if goal is None or goal.status != "active":
            return message.options
        return dataclasses.replace(message.options or TurnOptions(), no_deadline=True)

    def turn_ended(self, ended: TurnEnded) -> None:
        """The loop's end-of-turn hook: count a nudge turn, then continue, park or leave it."""
        key, message, result = ended.key, ended.message, ended.result
        goal = goals.open_goal(self.store, key)
        if goal is None or goal.status != "active":
            return
        if message.provenance == "goal" and result is not None:
            goal = goals.count_turn(self.store, goal.id, result.run.usage.total)
        if result is None or result.run.error is not None or result.outcome.value == "stale":
            # Stopped or failed: the person decides what next, no loop on failures. A nudge
            # that failed is said in the conversation: nobody may have been watching it.
            error = ended.end.error or (result.run.error if result is not None else None)
            if message.provenance == "goal" and ended.end.outcome != "stale" and error:
                self.tell(
                    key,
                    f"Goal waiting: its last turn failed ({error}): {goal.objective}\n"
                    "Your next message continues it; /goal stop ends it.",
                )
            return
        self.continue_goal(key, goal)

    async def resume(self) -> list[str]:
        """At the start of `heron serve`: every active goal whose conversation is free goes on
        with a nudge, as after its last turn (the process that ran it, a chat, has ended).
        Returns the conversations continued or parked."""
        went_on = []
        for key in await self.store.call(goals.active_keys, self.store):
            goal = await self.store.call(goals.open_goal, self.store, key)
            if goal is not None and goal.status == "active" and self.continue_goal(key, goal):
                went_on.append(key)
        return went_on

    def continue_goal(self, key: str, goal: goals.Goal, nudge_id: str | None = None) -> bool:
        """A nudge turn for the goal (`nudge_id` its message's id), or parked when its budget
        is used up; False when it waits (the person's message goes first, or a subagent's
        result will pick the work up)."""
        if self.loop.running(key) or self.loop.pending(key):
            return False  # the person's message goes first; its turn's end continues the goal
        if any(
            r.kind == "subagent" and r.status in ("running", "waiting") for r in self._owed(key)
        ):
            return False  # the subagent's result opens a turn that picks the work up
        channel, chat, _ = self.loop.origins.get(key, ("goal", key, "goal"))
        if goal.exhausted:
            goals.set_status(self.store, goal.id, "parked")
            note = (
                f"Goal parked: its budget is used up ({goal.budget()}): {goal.objective}\n"
                "/goal budget TURNS [TOKENS] continues it; /goal stop ends it."
            )
            self.tell(key, note)
            return True
        meta: dict[str, object] = {"synthetic": True, "goal": goal.id}
        options = TurnOptions(no_deadline=True, message_meta=meta, title=goal.objective)
        nudge = InboundMessage(
            channel, chat, NUDGE, key, provenance="goal", options=options, id=nudge_id
        )
        self.loop.start_turn(nudge)
        return True

    def tell(self, key: str, note: str) -> None:
        """Say `note` to whoever has the conversation open now, and keep it there as Heron's
        row (heron/agent/relay.py): the person who set the goal and walked away reads it
        later, and the model reads it as Heron's, not as the person's. On disk at once (one
        short insert, fine on the loop: this runs in the end-of-turn hook), moved in now or
        after the turn running there."""
        channel, chat, _ = self.loop.origins.get(key, ("goal", key, "goal"))
        self.loop.bus.emit(OutboundMessage(channel, chat, key, note, "notice", by=GOAL_WHO))
        waiting.hold(self.store, key, "default", note, GOAL_WHO, key)
        if not self.loop.running(key):  # else that turn's end moves it in
            self.loop.relays.release(key)

    def _owed(self, key: str) -> list[runs.Run]:
        return runs.open_for(self.store, key)


BACKGROUND_GOAL = (
    "This is background work (a scheduled job, the heartbeat or a subagent): it sets no goal, "
    "since nobody is here to follow it. Do what you can in this turn, and say what should "
    "continue so the user can set a goal."
)


@tool
async def goal(
    ctx: ToolContext, action: str, objective: str = "", evidence: str = ""
) -> str | ToolOutput:
    """Set, show or finish this conversation's sustained goal.

    A goal keeps you working across turns until it is met. Set one only when the user asks
    for sustained work; mark it done only with evidence that it is met.

    Args:
        action: "set" (with objective), "show", or "done" (with evidence).
        objective: What must be true when the goal is met (for "set").
        evidence: What shows the goal is met: results, paths, checks passed (for "done").
    """
    store, key = ctx.services.store, ctx.services.conversation_key
    if store is None or key is None:
        return ToolOutput("Goals are not available in this run.", True)
    if action == "show":
        return describe(await store.call(goals.open_goal, store, key))
    if action == "set":
        turn = ctx.services.turn
        if turn is not None and turn.provenance not in PERSONAL:
            # A reminder's turn set one and 20 nudges ran with nobody there (one a day, every
            # day): sustained work is the person's to start, as a question is theirs to answer.
            return ToolOutput(BACKGROUND_GOAL, True)
        if not objective.strip():
            return ToolOutput('Give the objective: goal(action="set", objective=...).', True)
        before = await store.call(goals.open_goal, store, key)
        made = await store.call(goals.set_goal, store, key, objective.strip())
        replaced = "" if before is None else f" (it replaced the goal: {before.objective})"
        return f"Goal set ({made.budget()}): {made.objective}{replaced}"
    if action == "done":
        if not evidence.strip():
            return ToolOutput("Say what shows the goal is met (evidence=...).", True)
        ended = await store.call(goals.end_goal, store, key, "done", evidence.strip())
        return "No open goal." if ended is None else f"Goal done: {ended.objective}"
    return ToolOutput(f'Unknown action {action!r}: use "set", "show" or "done".', True)


def attach(loop: AgentLoop) -> Goals:
    """Goals for this loop: the runtime line, the turn options, the nudges and the tool."""
    engine = loop.engine
    manager = Goals(loop)
    engine.attached.runtime_notes = lambda key: runtime_note(engine.store, key)
    loop.options_for = manager.options_for
    loop.watch_turns(manager.turn_ended)
    engine.attached.commands["goal"] = _goal
    if engine.registry.get("goal") is None and engine.registry.names():
        engine.registry.add(goal)
    return manager
