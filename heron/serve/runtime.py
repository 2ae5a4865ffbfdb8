"""What a `heron serve` runs: one AgentLoop for the home, its Dispatcher, the hub, and the
background services started with the loop.

Every client's message enters here (`submit`) as an InboundMessage that asks for its
TurnEvents, and everything the loop sends out goes, whatever channel it names, to the hub
(heron/serve/hub.py), which numbers it and fans it out to every client of that conversation.

Turns other processes run on the home (`heron run --model` beside the serve) reach the hub
through a watcher of the turn leases (heron/serve/elsewhere.py), while a client is attached.

Background services (idle compaction runs inside the AgentLoop; the scheduler's
`run_proactive(loop, ...)` and others are added to `services`) are async callables given the
AgentLoop, started after it and cancelled, then awaited, on shutdown.

The loop has the proactive work a turn starts attached, as in one process (subagents,
`ask_user`, goals: heron/proactive/wiring.py): subagents start with the loop (results owed by
an earlier process announced, runs it left open interrupted) and are closed before it, so a
subagent cut off by shutdown is recorded interrupted and announced at the next start. Turns
Heron starts itself (a result's announce turn, a goal's nudge) stream to the hub like a
person's. With workers (heron/scale/) none of this is attached to the face: the workers,
where the turns run, attach their own (docs/scale.md).

A command that needs the person's approval (no sandbox, approval "ask") is asked of every
client of its conversation (heron/agent/approvals.py); the first answer decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from heron import versions
from heron.agent.approvals import Approvals
from heron.agent.engine import Engine
from heron.agent.loop import AgentLoop
from heron.agent.turn import STOPPED
from heron.bus import Dispatcher, InboundMessage, MessageBus
from heron.config import ConfigWatch
from heron.errors import ConfigError
from heron.messages import File
from heron.proactive import wiring
from heron.providers.profiles import file_summary
from heron.serve.elsewhere import Watcher
from heron.serve.hub import Hub
from heron.store import engine_state as es
from heron.trace.prices import PriceTable


class Connected(Protocol):
    """A connected client's session (heron/serve/session.py), as shutdown sees it."""

    async def end(self) -> None: ...


Service = Callable[[AgentLoop], Awaitable[None]]
# The channel and chat of a turn Heron opens for a conversation no client of this serve has
# written in yet (a subagent's result owed by an earlier process): the chat ids that process
# gave its clients mean nothing here, where clients are numbered afresh, and a client given
# the same id would take the turn for its own. The hub shows it whatever channel it names.
HERON = ("heron", "heron")
log = logging.getLogger(__name__)
SERVICE_RETRY_S = 1.0  # a failed background service starts again after this, doubled
SERVICE_MAX_RETRY_S = 60.0  # up to this


class Runtime:
    """The loop, the dispatcher, the hub and the services of one serve process."""

    def __init__(
        self,
        engine: Engine,
        services: Sequence[Service] = (),
        *,
        idle: bool = True,
        make_loop: Callable[[Engine, MessageBus], AgentLoop] = AgentLoop,
        proactive: bool = True,
    ) -> None:
        self.engine = engine
        self.bus = MessageBus()
        # The loop turns run in; with workers (heron/scale/front.py), one that enqueues them.
        self.loop = make_loop(engine, self.bus)
        # The hub shows every turn of a conversation as it runs, Heron's own included.
        self.loop.heron_turn_events = True
        # Subagents, ask_user and goals, as in one process (heron/proactive/wiring.py); with
        # workers, not here: the turns run there, and the workers attach their own.
        self.proactive = wiring.attach(self.loop, channel=HERON) if proactive else None
        # An unconfined command asks every client of its conversation (heron/agent/approvals.py);
        # with workers, the worker running the turn asks, through the notes (docs/scale.md).
        self.approvals = Approvals(self.bus)
        if proactive:
            self.loop.approver_for = self.approvals.approver
        self.dispatcher = Dispatcher(self.bus)
        choice = engine.choice
        prices = PriceTable.from_config(engine.settings.config.prices)
        self.hub = Hub(
            about={
                "model": f"{choice.provider}/{choice.model}",
                "embedded": choice.embedded,
                # What a client's per-run environment may ask for otherwise (HERON_MODEL,
                # HERON_CONTEXT_WINDOW, HERON_BASE_URL): heron.channels.remote:serve_differs.
                "model_name": choice.model,
                "window": choice.profile.context_window,
                # The whole profile (a client's budget view builds the serve's next request),
                # and what a local model's file said (the chat's header shows it).
                "profile": dataclasses.asdict(choice.profile),
                "model_file": file_summary(choice),
                "base_url": choice.base_url,
                # Which Heron this is and which config.toml it loaded: a client that is
                # another Heron, or finds the file changed since, says so (remote.serve_news).
                "schema": versions.newest_step(),
                "config_digest": engine.settings.config.digest,
            },
            cost=lambda usage: prices.known_cost(choice.model, usage, choice.provider),
        )
        self.dispatcher.register("*", self.hub.deliver)
        # Turns other processes run on this home (`heron run --model`), told to the clients
        # (heron/serve/elsewhere.py); with workers, whose turns all run elsewhere, not yet.
        self.watcher = Watcher(self.hub, engine.store) if proactive else None
        # What background work's `message` tells its model: whether anyone sees it now.
        self.loop.attended = self.hub.attended
        self.services = list(services)
        self.idle = idle
        self._tasks: list[asyncio.Task[None]] = []
        self._service_tasks: list[asyncio.Task[None]] = []
        self.closed = False
        self.sessions: set[Connected] = set()  # connected clients, told when the serve stops
        # config.toml as it was when the serve loaded it: a later edit is read again (once per
        # change) so a broken file refuses messages as it would refuse them in-process.
        self._config = ConfigWatch(engine.settings.paths.config)

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    async def start(self) -> None:
        if self._tasks or self.closed:
            return
        # Turns a killed serve left running here are closed as RESTORE would close them, before
        # any client reads them: a tab reconnecting shows the stopped note and /retry at once.
        store = self.engine.store
        await store.call(es.close_dead_turns, store, STOPPED, off_loop=True)
        self._tasks = [
            asyncio.create_task(self.loop.run(idle=self.idle)),
            asyncio.create_task(self.dispatcher.run()),
        ]
        # What background work said that an earlier process left waiting (killed before the
        # turn it waited for ended) goes into its conversation now.
        self.loop.relays.sweep()
        if self.proactive is not None:  # results owed by an earlier process announced now,
            await self.proactive.start()
            await self.proactive.goals.resume()  # and goals a closed chat left open go on
        self._service_tasks = [asyncio.create_task(_guard(s, self.loop)) for s in self.services]
        if self.watcher is not None:
            watch = self.watcher.run
            self._service_tasks.append(asyncio.create_task(_guard(lambda _: watch(), self.loop)))

    def submit(
        self,
        text: str,
        key: str,
        channel: str,
        chat_id: str,
        agent: str = "default",
        files: tuple[File, ...] = (),
    ) -> None:
        """A client's message (with its attachments), command or /stop, for `key`."""
        message = InboundMessage(channel, chat_id, text, key, agent=agent, events=True, files=files)
        self.bus.inbound.put_nowait(message)

    async def config_problem(self) -> ConfigError | None:
        """Why config.toml, edited since the serve started, no longer loads (None: it does).
        The serve keeps the config it started with either way; this makes a broken file say
        so to every client, as `heron run` without a serve would."""
        return await self._config.problem()

    async def settle(self) -> None:
        """Until nothing runs or waits (subagents included) and every event reached the hub
        (tests, the bench)."""
        await wiring.settle(self.loop, self.proactive.subagents if self.proactive else None)

    async def close(self) -> None:
        """Shutdown: services cancelled, no turn started from here on, running turns stopped
        as by /stop (what they finished is kept), what the person sent that no turn read kept
        in its conversation unanswered (each client that sent it told so: AgentLoop.close),
        their last events delivered, every client told the serve stopped and its connection
        closed, then the loop's tasks ended."""
        if self.closed:
            return
        self.closed = True
        self.hub.stopping = True
        log.info("heron serve stopping: %d turns running", self.loop.turns_running)
        await _cancel(self._service_tasks)
        if self._tasks:
            if self.proactive is not None:  # subagents recorded interrupted, then the turns
                await self.proactive.close()
            await self.loop.close("heron serve stopped")  # what waits unread is kept
            await self.bus.outbound.join()  # the stopped turns' turn_end reaches the clients
        await asyncio.gather(*(s.end() for s in list(self.sessions)))
        await _cancel(self._tasks)
        log.info("heron serve stopped")


async def _guard(service: Service, loop: AgentLoop) -> None:
    """A service that fails is logged and started again after a back-off (the database
    out of reach for a while must not end the scheduler for good); it never takes the serve
    down. One that returns is done."""
    wait = SERVICE_RETRY_S
    while True:
        started = time.monotonic()
        try:
            await service(loop)
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            if time.monotonic() - started > SERVICE_MAX_RETRY_S:
                wait = SERVICE_RETRY_S  # it ran a good while: a new failure, not the same one
            log.exception("background service %r failed; started again in %.0f s", service, wait)
        await asyncio.sleep(wait)
        wait = min(wait * 2, SERVICE_MAX_RETRY_S)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
