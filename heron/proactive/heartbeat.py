"""The heartbeat: every `heartbeat_minutes` the lines of the workspace's HEARTBEAT.md are
checked in a silent turn of the conversation `heartbeat`.

- One tick per period across processes (`heron.store.jobs.claim_tick`); ticks missed while
  nothing ran, or while the last check was still going, coalesce into one.
- Skipped, and recorded so, while a turn the person started runs in this process, or when
  HEARTBEAT.md has nothing to check (no file, or only blank lines, headings and comments), or
  when the model in use has no tools: it could not call `message`, so the check could never
  report (`scheduler.NO_TOOLS`).
- Silent: it reaches the user only if the agent calls `message`. It is a scheduled turn, so the
  `schedule` tool refuses to create jobs from it: a heartbeat never breeds duplicate jobs.
- Bounded: once the conversation holds `tail_turns` turns since its last separator, the next
  check writes a new one and carries the last check's closing note (`TurnOptions.fresh_after`,
  applied by the turn under its own lease, as a monitor's), so its model sees a short tail,
  never all of it.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from heron import workspace_io
from heron.agent.loop import AgentLoop, TurnEnded
from heron.bus import InboundMessage, MessageBus, TurnOptions
from heron.proactive.clock import Clock
from heron.proactive.scheduler import CHANNEL, NO_TOOLS, TAIL_TURNS
from heron.store import Store
from heron.store import jobs as js
from heron.store.engine_state import HOST

KEY = "heartbeat"
PERSONAL = "personal"  # the person's own conversation (what `heron chat` opens)
PROMPT = (
    "[Heartbeat check. This runs in the background: nothing you write reaches the user unless "
    "you call the message tool. For each line below, check it now; call message only for "
    "what the user must hear (never an all-clear). End with one short line of what you "
    "checked.]\n{lines}"
)
HEARTBEAT_MAX = 64 * 1024  # bytes of HEARTBEAT.md read: a checklist, not a document
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_BULLET = re.compile(r"^(?:[-*+]|\d+[.)])\s+(?:\[[ xX]\]\s+)?")


def heartbeat_lines(workspace: Path) -> list[str]:
    """What HEARTBEAT.md asks to check: its non-blank lines that are not headings or comments,
    without their list markers."""
    try:  # a command can write it: no link followed, no FIFO waited on (workspace_io)
        found = workspace_io.read(workspace, "HEARTBEAT.md", HEARTBEAT_MAX)
    except OSError:
        return []
    text = found.data.decode("utf-8", errors="replace")
    text = _COMMENT.sub("", text)
    lines = [s.strip() for s in text.splitlines() if s.strip() and not s.lstrip().startswith("#")]
    return [_BULLET.sub("", line) for line in lines if _BULLET.sub("", line)]


@dataclass
class Heartbeat:
    store: Store
    bus: MessageBus
    clock: Clock
    workspace: Path
    minutes: float
    user_busy: Callable[[], bool]  # a turn the person started runs now
    tail_turns: int = TAIL_TURNS
    deliver_to: str = PERSONAL  # where its `message` reaches the user
    tools: bool = True  # the model in use is offered tools (`engine.offers_tools`)
    owner: str = field(default_factory=lambda: f"{HOST}:{os.getpid()}:{secrets.token_hex(4)}")
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    outstanding: bool = False  # a check was published and its turn has not ended
    checks: int = 0
    # Removes its end-of-turn hook from the loop it watches (`watch`).
    unwatch: Callable[[], None] = field(default=lambda: None, repr=False)

    @property
    def period(self) -> float:
        return self.minutes * 60.0

    def watch(self, loop: AgentLoop) -> None:
        self.unwatch = loop.watch_turns(self.turn_ended)

    async def run(self) -> None:
        while True:
            await self.beat()
            found = await self.store.call(js.tick, self.store, KEY)
            now = self.clock.now()
            deadline = now + self.period if found is None else found.last + self.period
            if self.outstanding:  # the check's end wakes us; until then nothing is due
                deadline = max(deadline, now + self.period)
            await self.clock.sleep_until(max(deadline, now), self.wake)
            self.wake.clear()

    async def beat(self) -> str:
        """Take this period's tick if it is due and check; returns what happened."""
        now = self.clock.now()
        if self.outstanding:  # the last check still runs: this tick folds into the next
            return "waiting"
        claimed = await self.store.call(
            js.claim_tick, self.store, KEY, self.owner, now, self.period
        )
        if not claimed:
            return "not due"
        if self.user_busy():
            await self._end("skipped", "a turn of the user's was running")
            return "skipped"
        lines = await asyncio.to_thread(heartbeat_lines, self.workspace)
        if not lines:
            await self._end("skipped", "HEARTBEAT.md has nothing to check")
            return "skipped"
        if not self.tools:
            await self._end("skipped", NO_TOOLS)
            return "skipped"
        self.outstanding = True
        self.checks += 1
        await self.bus.publish(
            InboundMessage(
                CHANNEL,
                KEY,
                PROMPT.format(lines="\n".join(f"- {line}" for line in lines)),
                key=KEY,
                provenance="scheduled",
                meta={
                    "heartbeat": self.owner,
                    "deliver_to": self.deliver_to,
                    "deliver_as": "the heartbeat check",  # who said it, where it is kept
                },
                options=TurnOptions(fresh_after=self.tail_turns),
            )
        )
        return "checked"

    async def _end(self, outcome: str, detail: str | None = None) -> None:
        await self.store.call(js.end_tick, self.store, KEY, outcome, detail)

    def turn_ended(self, ended: TurnEnded) -> None:
        if ended.message.meta.get("heartbeat") != self.owner:
            return
        self.outstanding = False
        end = ended.end
        js.end_tick(self.store, KEY, end.outcome if end.ok else "failed", end.error)
        self.wake.set()
