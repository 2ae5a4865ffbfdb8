"""Real workers for the scale tests: `heron worker` processes on the test's PostgreSQL schema,
a fake OpenAI server on 127.0.0.1 as their model, and a face (`FrontLoop`) in the test's
process that enqueues through DBOS's client and hears the workers' notes. Nothing is mocked:
the queue, the recovery and the notes are DBOS's and PostgreSQL's own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heron.agent.engine import Engine
from heron.bus import (
    Dispatcher,
    InboundMessage,
    MessageBus,
    Outbound,
    OutboundMessage,
    TurnEvent,
)
from heron.config import Settings
from heron.providers.scripted import ScriptedProvider
from heron.scale.cluster import QUEUE, cluster_of
from heron.scale.front import (
    FrontLoop,
    goals_service,
    governor_service,
    listener_service,
    polled_queue,
)
from heron.scale.notes import Publisher
from heron.scale.polling import IDLE_POLL_S, PollGovernor
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import Script

READY_S = 120.0
# The tests' workers look at the queue every 250 ms (the product's idle interval, which the
# governor sets in the same row), not every 50 ms: a poll costs a worker about 5 ms of CPU and
# the server some more, so at 50 ms an idle worker took 0.15 s of CPU a second, at 250 ms 0.06,
# while a turn waits 100 ms longer on average to be taken. What the tests check, the order,
# recovery and notes of turns, does not depend on how soon a worker looks.
TEST_POLL_S = IDLE_POLL_S


def worker_env(home: Path, pg_url: str, base_url: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI", "ANTHROPIC"))
    }
    env.update(
        HERON_HOME=str(home),
        HERON_DATABASE_URL=pg_url,
        HERON_BASE_URL=base_url,
        HERON_MODEL="fake-model",
        HERON_API_KEY="k",
        HERON_EMBEDDINGS="0",
    )
    if "HERON_BWRAP" in os.environ:  # a test of the unconfined path: the workers take it too
        env["HERON_BWRAP"] = os.environ["HERON_BWRAP"]
    return env


@dataclass
class Workers:
    env: dict[str, str]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    poll_s: float | None = TEST_POLL_S  # None: the interval the workers register (POLL_S)

    def start(self, n: int = 1) -> None:
        started = [
            subprocess.Popen(
                [sys.executable, "-m", "heron", "worker"],
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(n)
        ]
        self.procs += started  # before the wait: `stop` ends them even if one never gets ready
        for p in started:
            _wait_ready(p)
        if self.poll_s is not None:  # after each start: a worker registers the queue anew
            set_polling(self.env["HERON_DATABASE_URL"], self.poll_s)

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            if p.pid == pid:
                p.wait(30)

    def stop(self) -> None:
        """SIGTERM to every worker still running; each must drain and exit 0 (a traceback at
        shutdown fails the test that started it)."""
        running = [p for p in self.procs if p.poll() is None]
        for p in running:
            p.terminate()
        failed = []
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                failed.append(f"worker {p.pid} did not exit within 60 s of SIGTERM")
        failed += [f"worker {p.pid} exited {p.returncode}" for p in running if p.returncode]
        assert not failed, "; ".join(failed)


def set_polling(pg_url: str, seconds: float) -> None:
    """The workers' interval between looks at the queue: its row in DBOS's tables, which each
    worker reads again at every poll (what the face's governor changes too)."""
    import psycopg

    table = cluster_of(pg_url).dbos_schema + ".queues"
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
        sql = f"UPDATE {table} SET polling_interval_sec = %s WHERE name = %s"
        assert conn.execute(sql, (seconds, QUEUE)).rowcount == 1, "no queue registered"


def _wait_ready(p: subprocess.Popen[str]) -> None:
    assert p.stdout is not None
    deadline = time.monotonic() + READY_S
    lines = []
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            raise AssertionError("the worker exited before it was ready:\n" + "".join(lines))
        lines.append(line)
        if line.startswith("heron worker: ready"):
            # The rest of its output is echoed (pytest shows it on failure); a full pipe
            # would block the worker.
            import threading

            def echo() -> None:
                assert p.stdout is not None
                for out in p.stdout:
                    sys.stderr.write(f"[worker {p.pid}] {out}")

            threading.Thread(target=echo, daemon=True).start()
            return
    raise AssertionError("the worker was not ready in time:\n" + "".join(lines))


@dataclass
class Face:
    loop: FrontLoop
    events: list[Outbound]
    governor: PollGovernor | None = None

    def send(self, key: str, text: str, **kw: Any) -> None:
        self.loop.bus.inbound.put_nowait(
            InboundMessage("test", key, text, key=key, events=True, **kw)
        )

    async def settle(self, timeout: float = 240.0) -> None:
        async with asyncio.timeout(timeout):
            await self.loop.bus.inbound.join()
            await self.loop.wait_idle()
            await self.loop.bus.outbound.join()  # the last notes handed to `events` too

    def kinds(self, key: str) -> list[str]:
        return [e.kind for e in self.events if isinstance(e, TurnEvent) and e.key == key]

    def texts(self, kind: str, key: str | None = None) -> list[str]:
        """The text of every outbound message of `kind` (answer, command, error...)."""
        return [
            e.text
            for e in self.events
            if isinstance(e, OutboundMessage) and e.kind == kind and key in (None, e.key)
        ]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 240.0) -> None:
        """Until `predicate()`; fails at once, with the error, when a turn fails instead."""
        deadline = time.monotonic() + timeout
        while not predicate():
            assert not self.texts("error"), self.texts("error")
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def face(
    pg_url: str, monkeypatch: Any, governed: bool = False, resume_goals: bool = False
) -> AsyncIterator[Face]:
    """The FrontLoop of a serve with workers, in this process (the workers must be up: they
    create DBOS's schema). `governed`: with the serve's governor of the workers' polling,
    checking every 50 ms; `resume_goals`: with the serve's start-up continuation of goals."""
    from dbos import DBOSClient

    monkeypatch.setenv("HERON_DATABASE_URL", pg_url)
    settings = Settings.load()
    cluster = cluster_of(settings.database)
    client = DBOSClient(
        system_database_url=cluster.dbos_url, dbos_system_schema=cluster.dbos_schema
    )
    publisher = Publisher(cluster)
    events: list[Outbound] = []
    async with Engine.open(settings, provider=ScriptedProvider([])) as engine:
        bus = MessageBus()
        governor = await polled_queue(client) if governed else None
        if governor is not None:
            governor.check_s = 0.05
        loop = FrontLoop(engine, bus, queue=client, publisher=publisher, governor=governor)
        dispatcher = Dispatcher(bus)

        async def keep(o: Outbound) -> None:
            events.append(o)

        dispatcher.register("*", keep)
        tasks = [
            asyncio.create_task(loop.run(idle=False)),
            asyncio.create_task(dispatcher.run()),
            asyncio.create_task(listener_service(cluster)(loop)),
        ]
        if governor is not None:
            tasks.append(asyncio.create_task(governor_service(governor)(loop)))
        if resume_goals:
            tasks.append(asyncio.create_task(goals_service(cluster)(loop)))
        try:
            yield Face(loop, events, governor)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await publisher.close()
            client.destroy()


@contextlib.contextmanager
def model_server(script: Script) -> Iterator[tuple[FakeOpenAIServer, str]]:
    server = FakeOpenAIServer(script)
    url = server.start()
    try:
        yield server, url
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def on_workers(
    script: Script, home: Path, pg_url: str, monkeypatch: Any, n: int = 2, governed: bool = False
) -> AsyncIterator[tuple[FakeOpenAIServer, Workers, Face]]:
    """A model server answering by `script`, `n` workers on it and a face: what most tests of
    the workers run in. The workers are stopped (SIGTERM, drained) on leaving. One worker does
    for a test of what crosses from the face to a worker and back; two, for what they share.
    Each is a process of about a second's CPU to start, then polls the queue every TEST_POLL_S
    (`governed`: as the face's governor sets it)."""
    with model_server(script) as (server, url):
        poll_s = None if governed else TEST_POLL_S
        workers = Workers(worker_env(home, pg_url, url), poll_s=poll_s)
        try:
            workers.start(n)
            async with face(pg_url, monkeypatch, governed) as f:
                yield server, workers, f
        finally:
            workers.stop()
