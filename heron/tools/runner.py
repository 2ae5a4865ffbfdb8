"""The unconfined tool runner: what starts a tool command when bubblewrap cannot.

    python -I -S runner.py heron-tool-runner PARENT_PID -- COMMAND...

It stands where bwrap stands when confined: its argv carries the mark the person-only commands
look for among their ancestors (heron/tools/person.py), and nothing the command starts outlives
it. It is a child subreaper (PR_SET_CHILD_SUBREAPER), so a process the command detaches with
setsid and a double fork is reparented to it, not to init: it stays in the chain, and when the
command exits, or Heron dies (PR_SET_PDEATHSIG), every process left below it is killed.

Few imports, no Heron ones: it starts with -S, and every module costs start-up time on each
command (pathlib alone would double it).
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def children() -> list[int]:
    """The pids whose parent is this process (reparented orphans included)."""
    tasks = f"/proc/{os.getpid()}/task"
    found: set[int] = set()
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/children") as listing:
                found.update(int(p) for p in listing.read().split())
        except (OSError, ValueError):
            continue
    return sorted(found)


def end_all() -> None:
    """SIGKILL every process below this one, wave after wave: the orphans of one wave are
    reparented here and make the next."""
    while kids := children():
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def wait_for(pid: int) -> int:
    """The exit code of `pid`, reaping the orphans that die meanwhile."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 127
        if done == pid:
            return os.waitstatus_to_exitcode(status)


def _stop(signum: int, frame: object) -> None:
    end_all()
    os._exit(128 + signum)


def main(argv: list[str]) -> int:
    parent, command = int(argv[2]), argv[4:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # Heron died before the death signal was armed
        return 1
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        # Python ignores SIGPIPE and SIGXFSZ, and an exec keeps what is ignored: the command
        # starts with every signal at its default, as from a terminal (`yes | head` relies on
        # SIGPIPE).
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(number, signal.SIG_DFL)
        try:
            os.execv(command[0], command)
        except OSError as error:
            print(f"{command[0]}: {error.strerror}", file=sys.stderr)
        os._exit(127)
    code = wait_for(pid)
    end_all()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
