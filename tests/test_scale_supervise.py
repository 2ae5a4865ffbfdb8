"""`heron serve --workers N` keeps its workers alive and says when none is (QA 16 defect 4):
a real serve on the test's PostgreSQL, its real `heron worker` children killed with SIGKILL,
the real `heron run` as the client. Every wait is bounded by a timeout of the harness; no
assertion is on how long anything took (the recovery's time is printed for docs/scale.md)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pg import raw_count
from scale_helpers import Workers, model_server, worker_env
from serve_helpers import LineClient
from test_scale_workers import _dbos_count, _tool_then_answer, echo
from waiting import until

from heron.serve.lock import SOCKET_NAME

pytestmark = [pytest.mark.pg, pytest.mark.slow]
WAIT_S = 240.0


class Serve:
    """`heron serve --port 0 --workers N` with its stderr collected line by line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.err: list[str] = []
        assert proc.stderr is not None
        threading.Thread(target=self._read, args=(proc.stderr,), daemon=True).start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.err.append(line)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.err)

    def workers(self) -> set[int]:
        """The pids of its `heron worker` children now."""
        found = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            if ppid == self.proc.pid and b"worker" in cmdline:
                found.add(int(entry))
        return found


@contextmanager
def serve(home: Path, env: dict[str, str], n: int) -> Iterator[Serve]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "heron", "serve", "--port", "0", "--workers", str(n)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # once its workers are ready (or given up)
        assert first.startswith("heron serve: http://127.0.0.1:"), first
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # never a full pipe
        yield Serve(proc)
        if proc.poll() is None:  # not killed by the test
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
            assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def heron_run(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heron", "run", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_killed_worker_of_a_serve_is_replaced_and_its_turn_answered(
    pg_url: str, heron_home: Path
) -> None:
    """kill -9 of the only worker while its turn waits on the model: the serve says how it
    ended and starts another, the waiting `heron run` hears that no worker runs and that one
    is coming, and the new worker finishes the turn (the tool not run again)."""
    slow = {"w1": 120.0}  # the turn's second model call is held: the kill lands there
    with model_server(_tool_then_answer(slow)) as (server, url):
        env = worker_env(heron_home, pg_url, url)
        with serve(heron_home, env, 1) as face:
            (first,) = face.workers()
            running = asyncio.create_task(heron_run(env, "-c", "w1", "work on w1"))
            await until(lambda: len(server.requests) >= 2, timeout=WAIT_S)
            os.kill(first, signal.SIGKILL)
            killed = time.monotonic()
            code, out, err = await running
            took = time.monotonic() - killed
            status = await heron_run(env, "-c", "w1", "/status")
            client = await LineClient.open(heron_home / SOCKET_NAME)
            await client.send({"type": "hello", "conversation": "w1", "last_seq": None})
            welcome = await client.next()
            await client.close()
    print(f"\nkilled worker's turn answered {took:.1f} s after the kill")
    assert code == 0, err
    assert "finished w1" in out
    told = f"heron: no worker is running: worker 1 (pid {first}) was killed by SIGKILL"
    assert told in err and "your message is queued and runs then" in err
    assert face.said(f"worker 1 (pid {first}) was killed by SIGKILL; starting another in 1 s")
    assert face.said("worker 1 is back (pid ")
    assert (heron_home / "workspace" / "ran.txt").read_text().splitlines() == ["ran"]
    statuses = raw_count(
        pg_url,
        "SELECT string_agg(status || ':' || COALESCE(stop_reason, ''), ',' ORDER BY id) FROM turns",
    )
    assert statuses == "interrupted:recovered,done:done"
    assert status[0] == 0 and "workers: 1 alive on this store" in status[1], status
    assert welcome["type"] == "welcome" and welcome["workers"] == {"alive": 1, "of": 1}
    assert "Traceback" not in "".join(face.err), "".join(face.err)[-3000:]


async def test_with_no_worker_alive_a_message_is_told_at_once_and_runs_when_one_starts(
    pg_url: str, heron_home: Path
) -> None:
    """Every worker the serve starts is killed at once, three times: the serve gives up on
    it and says why. A `heron run` then hears that no worker is running and what to do, and
    exits; its message stays queued, and a `heron worker` started later answers it."""
    with model_server(echo) as (server, url):
        env = worker_env(heron_home, pg_url, url)
        with serve(heron_home, env, 1) as face:
            killed: list[int] = []
            while not face.said("not restarting it"):
                for pid in face.workers() - set(killed):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                assert len(killed) <= 3, face.err
                assert face.proc.poll() is None, face.err
                await asyncio.sleep(0.02)
            code, out, err = await heron_run(env, "-c", "nw", "anyone there?")
            client = await LineClient.open(heron_home / SOCKET_NAME)
            await client.send({"type": "hello", "conversation": "nw", "last_seq": None})
            welcome = await client.next()
            await client.close()
            assert _dbos_count(pg_url, "status = 'ENQUEUED'") == 1  # queued, not lost
            workers = Workers(worker_env(heron_home, pg_url, url))
            try:
                await asyncio.to_thread(workers.start, 1)
                done = "SELECT COUNT(*) FROM turns WHERE status = 'done'"
                await until(lambda: raw_count(pg_url, done) == 1, timeout=WAIT_S)
            finally:
                workers.stop()
    assert code == 1 and out == "", (code, out, err)
    assert f"heron: no worker is running: worker 1 (pid {killed[-1]}) was killed by SIGKILL" in err
    assert "so heron serve no longer restarts it" in err
    assert "Do not send it again" in err and "the turn failed" not in err
    assert face.said("3 times in a row within 30 s of its start: not restarting it")
    assert welcome["workers"] == {"alive": 0, "of": 1}
    assert [r for r in server.requests if "anyone there?" in str(r)]  # run by the new worker


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_the_workers_of_a_serve_killed_with_minus_9_stop_too(
    pg_url: str, heron_home: Path
) -> None:
    """kill -9 leaves the serve no time to stop its workers: each notices it lost its serve
    and stops, so a serve started next does not run beside a crowd of the last one's."""
    with model_server(echo) as (_server, url):
        env = worker_env(heron_home, pg_url, url)
        with serve(heron_home, env, 2) as face:
            workers = face.workers()
            assert len(workers) == 2
            face.proc.kill()
            face.proc.wait()
            await until(lambda: not any(_alive(pid) for pid in workers), timeout=WAIT_S)
    assert any("is gone: stopping" in line for line in face.err), face.err
