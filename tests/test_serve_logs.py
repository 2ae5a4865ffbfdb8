"""`heron serve`'s log (heron/serve/logs.py): Heron's own lines with time, level and source,
INFO included; a turn's start and end said. In-process, with the scripted provider."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest

from heron.serve.logs import log_to_stderr

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d{4} (INFO|WARNING) heron\.[\w.]+: .+$")


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    logger = logging.getLogger("heron")
    before = logger.level, logger.propagate
    handler = log_to_stderr(out)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(before[0])
    logger.propagate = before[1]


def test_each_line_has_its_time_level_and_source_and_info_is_kept(stream: io.StringIO) -> None:
    logging.getLogger("heron.proactive.review").info("nightly review: 2 entries kept")
    logging.getLogger("heron.serve.runtime").warning("background service failed")
    logging.getLogger("heron.serve.runtime").debug("not said")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert all(LINE.match(line) for line in lines), lines
    assert lines[0].endswith("INFO heron.proactive.review: nightly review: 2 entries kept")
    assert lines[1].endswith("WARNING heron.serve.runtime: background service failed")
