"""The signals `heron run` keeps from its very start (heron/entry.py), before it imports
anything heavy: a SIGINT, SIGTERM or SIGHUP while Python imports the run's channel
(heron/channels/script.py, which reads them) and opens the engine is kept here, so the run
then sends nothing and says so, instead of a KeyboardInterrupt traceback. Only the standard
library is imported here."""

from __future__ import annotations

import signal
import time

# Each stops the turn as /stop does. SIGHUP too (the terminal closed, or `nohup`-less job
# control): the run ends as for SIGTERM, and a JSON line still goes to a file or a pipe.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# One signal can come twice: `timeout` sends it to the process, then to its process group.
TWICE_WITHIN = 1.0
# Signals that came before the run's own handlers were in place: (number, monotonic time).
_EARLY: list[tuple[int, float]] = []


def catch_early_signals() -> None:
    """From the start of `heron run` (heron/entry.py): a SIGINT, SIGTERM or SIGHUP that comes while
    Python imports and the engine opens is kept for `_cuts`, so the run then sends
    nothing and says so (the JSON object too) instead of dying silently. A second one ends
    the process at once."""
    for number in taken():
        signal.signal(number, _early)


def taken() -> tuple[int, ...]:
    """The SIGNALS `heron run` takes: not one its parent set to be ignored (`nohup` ignores
    SIGHUP, a shell's background job SIGINT), which must go on being ignored."""
    return tuple(n for n in SIGNALS if signal.getsignal(n) is not signal.SIG_IGN)


def _early(number: int, frame: object) -> None:
    if _EARLY:
        signalled_again(number, _EARLY[0][1])
    else:
        _EARLY.append((number, time.monotonic()))


def signalled_again(number: int, first: float) -> None:
    """A signal after the one that is stopping the run: the same one sent twice is passed
    over; another ends the process at once, as the signal would without these handlers."""
    if time.monotonic() - first < TWICE_WITHIN:
        return
    signal.signal(number, signal.SIG_DFL)
    signal.raise_signal(number)
