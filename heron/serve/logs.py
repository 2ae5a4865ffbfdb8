"""`heron serve`'s log: every line of Heron's own loggers (`heron.*`) on stderr with its time,
level and source, INFO included, so that an operator can tie "background service failed" to a
time, and see the turns that started and ended, the jobs that fired, the clients that came
and went and the shutdown. Third-party loggers keep their own levels (uvicorn: warnings)."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S%z"


def log_to_stderr(stream: TextIO | None = None, level: int = logging.INFO) -> logging.Handler:
    """Send the `heron` loggers' lines at `level` and above to `stream` (stderr), formatted;
    returns the handler (tests remove it)."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    logger = logging.getLogger("heron")
    logger.addHandler(handler)
    logger.setLevel(level)
    # Said once, here: not through the root logger's handlers as well (a library's
    # basicConfig would print each line twice).
    logger.propagate = False
    return handler
