"""The worker processes of `heron serve --workers N`: started before the face takes
messages (each says it is ready once it listens to the queue), stopped when it exits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator

from heron.errors import HeronError

READY = "heron worker: ready"
_draining: set[asyncio.Task[None]] = set()  # held: a task nobody references may be collected
START_S = 120.0  # a worker opens the engine and launches DBOS (migrations on a fresh database)


@contextlib.asynccontextmanager
async def workers(n: int, model: str | None = None) -> AsyncIterator[list[int]]:
    """Start `n` `heron worker` processes on this home; yields their pids."""
    procs: list[asyncio.subprocess.Process] = []
    try:
        for _ in range(n):
            args = [sys.executable, "-m", "heron", "worker"]
            if model:
                args += ["--model", model]
            procs.append(
                await asyncio.create_subprocess_exec(
                    *args, stdout=asyncio.subprocess.PIPE, env=dict(os.environ)
                )
            )
        await asyncio.gather(*(_ready(p) for p in procs))
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
        for p in procs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p.wait(), 90)
            if p.returncode is None:
                p.kill()


async def _ready(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(START_S):
            while True:
                line = await proc.stdout.readline()
                if not line:
                    raise HeronError(f"a worker (pid {proc.pid}) exited before it was ready")
                if line.decode(errors="replace").startswith(READY):
                    break
    except TimeoutError as e:
        raise HeronError(f"a worker (pid {proc.pid}) was not ready in {START_S:.0f} s") from e
    task = asyncio.create_task(_drain(proc))
    _draining.add(task)
    task.add_done_callback(_draining.discard)


async def _drain(proc: asyncio.subprocess.Process) -> None:
    """The worker's later output, echoed (a full pipe would block it)."""
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        sys.stdout.write(line.decode(errors="replace"))
