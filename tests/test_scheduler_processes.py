"""A one-shot reminder whose turn is cut off by a real `heron serve` ending, with kill -9 (a
crash, the OOM killer) or SIGTERM (a restart): the next serve closes the run left open, runs the
reminder once more, saying it is late and why, and never a third time. Against a fake OpenAI
server whose first answer stalls mid-stream."""

from __future__ import annotations

import datetime as dt
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import ServeProcess

from heron.store import Store
from heron.store import jobs as js
from heron.store.schedule import parse
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # real processes


def _until(what: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("not within the timeout")


def _runs(home: Path, job_id: int) -> list[js.JobRun]:
    store = Store(home / "heron.db")
    try:
        return js.runs(store, job_id)
    finally:
        store.close()


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_a_reminder_cut_off_by_a_serve_ending_is_delivered_once_by_the_next(heron_home, how):
    never = threading.Event()  # the first answer stalls until its serve is gone

    def model(body: dict[str, Any]) -> ServerReply:
        if "late: due" in json.dumps(body["messages"][-1]):
            return ServerReply(text="Water the plants (a little late).")
        return ServerReply(text="Water the plants now", chunk_size=4, stall_after_events=3,
                           resume=never)  # fmt: skip

    with FakeOpenAIServer(model) as server:
        env = {"HERON_BASE_URL": server.base_url, "HERON_MODEL": "fake-model",
               "HERON_API_KEY": "k"}  # fmt: skip
        store = Store(heron_home / "heron.db")
        soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)).isoformat()
        job = js.create_job(
            store, parse(at=soon, timezone="UTC"), conversation="personal",
            prompt="Water the plants.", now=time.time(),
        )  # fmt: skip
        store.close()
        with ServeProcess(heron_home, env) as first:
            assert first.proc is not None
            _until(lambda: server.requests)  # the reminder's turn streams
            if how == "kill -9":
                first.proc.kill()
            else:
                first.proc.send_signal(signal.SIGTERM)
            first.proc.wait(60)
        (cut,) = _runs(heron_home, job.id)
        assert cut.status == ("running" if how == "kill -9" else "interrupted")
        with ServeProcess(heron_home, env):
            runs = _until(lambda: [r for r in _runs(heron_home, job.id) if r.status == "done"])
            late = [b for b in server.requests if "late: due" in json.dumps(b["messages"][-1])]
            assert len(late) == 1
        again, old = _runs(heron_home, job.id)
        assert runs == [again] and again.outcome == "delivered"
        assert (old.id, old.status, old.outcome) == (cut.id, "interrupted", js.RETRIED)
        said = "killed or crashed" if how == "kill -9" else "it stopped"
        assert said in again.detail
        # A third serve has nothing left to run again.
        with ServeProcess(heron_home, env):
            time.sleep(
                1.0
            )  # its scheduler starts with it: time for its start to run again anything
        assert len(_runs(heron_home, job.id)) == 2
        assert sum("late: due" in json.dumps(b["messages"][-1]) for b in server.requests) == 1
