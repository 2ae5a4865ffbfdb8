"""The worker processes of `heron serve --workers N`, kept alive by the face.

Each of the N slots runs one `heron worker`. The face starts them before it takes messages
(each says it is ready once it listens to the queue) and watches them: when one exits (a
crash, kill -9, the OOM killer) the face says so on stderr, with its exit code or signal, and
starts another after a backoff: 1 s, doubled for each death in a row that came within
`QUICK_S` of the start, up to `MAX_BACKOFF_S`. A slot whose worker dies that soon `MAX_QUICK`
times in a row is left stopped, and the face says why: a worker that cannot start (a broken
install, a database it cannot reach) would only fill the log. The new worker takes over the
dead one's turns (its sweep, heron/scale/worker.py). On the face's exit every worker is sent
SIGTERM and drains its turns.

What the face tells the person when none is alive (`Staff.absent`) and the welcome's count
(`Staff.counts`) come from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal, TextIO

from heron.own_python import python_module

READY = "heron worker: ready"
START_S = 120.0  # a worker opens the engine and launches DBOS (migrations on a fresh database)
QUICK_S = 30.0  # a worker that exits this soon after it was started "died at once"
MAX_QUICK = 3  # deaths at once in a row before the face stops restarting the slot
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STOP_S = 90.0  # on the face's exit: how long a worker may drain its turns after SIGTERM

State = Literal["starting", "alive", "restarting", "paused"]
_AT_ONCE = f"{MAX_QUICK} times in a row within {QUICK_S:.0f} s of its start"


@dataclass
class Slot:
    """One of the N workers the face keeps running."""

    number: int
    state: State = "starting"
    pid: int | None = None
    proc: asyncio.subprocess.Process | None = None
    executor: str | None = None  # its DBOS executor id, from its ready line
    exited: str | None = None  # how its last worker ended ("was killed by SIGKILL")
    quick: int = 0  # deaths at once in a row
    restart_at: float = 0.0  # clock time of the next start, while "restarting"
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # ready once, or paused

    def describe(self, now: float) -> str:
        """What the person reads about a slot with no live worker."""
        who = f"worker {self.number}" + (f" (pid {self.pid})" if self.pid else "")
        if self.state == "starting":
            return f"{who} is starting"
        if self.state == "restarting":
            wait = max(0.0, self.restart_at - now)
            return f"{who} {self.exited}; heron serve starts another in {wait:.0f} s"
        return f"{who} {self.exited}, {_AT_ONCE}, so heron serve no longer restarts it"


def how_it_ended(code: int, ready: bool) -> str:
    """A worker's end in words: its signal or its exit code, and whether it had started."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        said = f"was killed by {name}"
    else:
        said = f"exited with code {code}"
    return said if ready else f"{said} before it was ready"


def worker_command(model: str | None) -> list[str]:
    """The command of one worker: it knows this process, and ends when it is gone."""
    args = python_module("heron", "worker", "--face", str(os.getpid()))
    return [*args, "--model", model] if model else args


@dataclass
class Staff:
    """The face's workers: started, watched, restarted, stopped (see the module docstring)."""

    n: int
    command: list[str]
    err: TextIO = field(default_factory=lambda: sys.stderr)
    clock: Callable[[], float] = time.monotonic
    start_s: float = START_S
    slots: list[Slot] = field(default_factory=list)
    # Told (synchronously) whenever a slot's state changes: the face re-checks whether any
    # worker is alive, the welcome's count is kept current.
    listeners: list[Callable[[], None]] = field(default_factory=list)
    _keepers: list[asyncio.Task[None]] = field(default_factory=list)
    _drains: set[asyncio.Task[None]] = field(default_factory=set)
    _closing: bool = False

    @property
    def alive(self) -> int:
        return sum(1 for s in self.slots if s.state == "alive")

    @property
    def coming(self) -> bool:
        """Whether a worker is on its way (starting, or to be restarted)."""
        return any(s.state in ("starting", "restarting") for s in self.slots)

    def counts(self) -> dict[str, int]:
        """For the welcome: how many of the face's workers are alive."""
        return {"alive": self.alive, "of": self.n}

    @property
    def executors(self) -> list[str]:
        """The executor ids of the face's workers, dead or alive."""
        return [s.executor for s in self.slots if s.executor is not None]

    def summary(self) -> str:
        now = self.clock()
        down = [s.describe(now) for s in self.slots if s.state != "alive"]
        said = f"{self.alive} of {self.n} workers alive"
        return f"{said} ({'; '.join(down)})" if down else said

    def absent(self) -> str:
        """Why no worker of this face runs, slot by slot."""
        now = self.clock()
        return "; ".join(s.describe(now) for s in self.slots)

    async def start(self) -> None:
        """Start every slot; return once each has had a worker ready, or was given up."""
        self.slots = [Slot(i + 1) for i in range(self.n)]
        self._keepers = [asyncio.create_task(self._keep(s)) for s in self.slots]
        await asyncio.gather(*(s.settled.wait() for s in self.slots))

    async def close(self) -> None:
        """SIGTERM to every worker (each drains its turns), SIGKILL after `STOP_S`."""
        self._closing = True
        for keeper in self._keepers:
            keeper.cancel()
        await asyncio.gather(*self._keepers, return_exceptions=True)
        procs = [s.proc for s in self.slots if s.proc is not None and s.proc.returncode is None]
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p.wait(), STOP_S)
            if p.returncode is None:
                p.kill()
                await p.wait()
        for task in list(self._drains):
            task.cancel()

    # ---- one slot --------------------------------------------------------------------------

    async def _keep(self, slot: Slot) -> None:
        """Run the slot's worker, and another after each death, until the face closes or the
        slot is given up."""
        while not self._closing:
            how, quick = await self._run_once(slot)
            if self._closing:
                return
            self._died(slot, how, quick)
            if slot.state == "paused":
                return
            await asyncio.sleep(max(0.0, slot.restart_at - self.clock()))

    async def _run_once(self, slot: Slot) -> tuple[str, bool]:
        """One worker of the slot, from its start to its end: how it ended, and whether that
        was at once."""
        started = self.clock()
        try:
            proc = slot.proc = await asyncio.create_subprocess_exec(
                *self.command, stdout=asyncio.subprocess.PIPE, env=dict(os.environ)
            )
        except OSError as error:  # no such interpreter, no memory left to fork
            return f"could not be started ({error})", True
        slot.pid, slot.state = proc.pid, "starting"
        self._changed()
        ready = await self._ready(proc, slot)
        if ready:
            if slot.exited is not None:
                self._say(f"worker {slot.number} is back (pid {proc.pid})")
            slot.state = "alive"
            slot.settled.set()
            self._changed()
        code = await proc.wait()
        return how_it_ended(code, ready), self.clock() - started < QUICK_S

    def _died(self, slot: Slot, how: str, quick: bool) -> None:
        slot.exited = how
        slot.quick = slot.quick + 1 if quick else 1
        who = f"worker {slot.number} (pid {slot.pid})"
        if slot.quick >= MAX_QUICK:
            slot.state = "paused"
            slot.settled.set()
            self._say(
                f"{who} {how}, {_AT_ONCE}: not restarting it. Its output above says why; fix "
                "that and restart heron serve (or start `heron worker` on this home)."
            )
        else:
            wait = min(FIRST_BACKOFF_S * 2 ** (slot.quick - 1), MAX_BACKOFF_S)
            slot.state, slot.restart_at = "restarting", self.clock() + wait
            self._say(f"{who} {how}; starting another in {wait:.0f} s")
        self._changed()

    async def _ready(self, proc: asyncio.subprocess.Process, slot: Slot) -> bool:
        """Whether the worker said it is ready (its executor id noted); False when it exited
        first, or was stopped for taking longer than `start_s`. Its later output is echoed."""
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(self.start_s):
                while True:
                    line = (await proc.stdout.readline()).decode(errors="replace")
                    if not line:
                        return False
                    if line.startswith(READY):  # "heron worker: ready (<executor>, <model>)"
                        slot.executor = line.partition("(")[2].partition(",")[0] or None
                        break
        except TimeoutError:
            self._say(f"a worker (pid {proc.pid}) was not ready in {self.start_s:.0f} s")
            proc.kill()
            return False
        task = asyncio.create_task(_drain(proc))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)
        return True

    def _say(self, text: str) -> None:
        self.err.write(f"heron serve: {text}\n")
        self.err.flush()

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()


async def _drain(proc: asyncio.subprocess.Process) -> None:
    """The worker's later output, echoed (a full pipe would block it)."""
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        sys.stdout.write(line.decode(errors="replace"))


@contextlib.asynccontextmanager
async def workers(n: int, model: str | None = None) -> AsyncIterator[Staff]:
    """`n` `heron worker` processes on this home, kept alive until the block ends."""
    staff = Staff(n, worker_command(model))
    try:
        await staff.start()
        yield staff
    finally:
        await staff.close()
