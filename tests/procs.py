"""Child processes of a test: started so that they race, and never left behind."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

_started: list[subprocess.Popen[str]] = []


def spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A child with pipes for stdin, stdout and stderr, killed at the end of the test if it
    still runs (`reap`): a test that fails or times out leaves no process behind."""
    proc = subprocess.Popen(
        args,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _started.append(proc)
    return proc


@pytest.fixture(autouse=True)
def reap() -> Iterator[None]:
    """Kill what `spawn` started and is still running once the test ends."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def start_together(procs: list[subprocess.Popen[str]], timeout: float) -> list[tuple[str, str]]:
    """Wait until every process said "ready" (started, connected), send each a line so they
    begin at once, and collect (stdout, stderr) of each; every one must exit 0."""
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=timeout) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-3000:] for _, err in outs]
    return outs
