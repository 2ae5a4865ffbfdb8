"""Child processes that must race: started, then released together."""

from __future__ import annotations

import subprocess


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
