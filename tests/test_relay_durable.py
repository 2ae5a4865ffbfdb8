"""A monitor's message to a conversation whose turn runs waits on disk, not in memory: a kill -9
of the real `heron serve` while it waits loses nothing. The restarted serve moves it into the
conversation once, labelled as Heron's, after the killed turn and before the next turn's rows,
and the model of that next turn reads it (heron/agent/relay.py, heron/store/waiting.py). With no
serve, an in-process `heron run` moves in what waits before its turn reads the history."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from serve_helpers import WAIT, LineClient, ServeProcess, clean_env
from waiting import until

from heron.agent.relay import RELAY_META
from heron.config import Settings
from heron.serve.lock import SOCKET_NAME
from heron.store import Store, StoredMessage, waiting
from heron.store import jobs as js
from heron.store.schedule import parse
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

ALERT = "MONITOR ALERT: the build is red"
CHECK = "[Scheduled check, job"  # how the scheduler opens a monitor's turn


class Model:
    """The monitor's first call says ALERT with `message`, its stream held until the turn in
    `personal` has asked the model (so the message comes while that turn runs); that first
    `personal` call never answers (the serve is killed meanwhile); later ones answer."""

    def __init__(self) -> None:
        self.personal_runs = threading.Event()
        self.personal: list[dict[str, Any]] = []  # the requests of `personal`'s turns
        self.told: list[str] = []  # what the `message` tool answered the monitor's model
        self.alerts = 0

    def __call__(self, body: dict[str, Any]) -> ServerReply:
        messages = body["messages"]
        if CHECK in json.dumps(messages):
            if messages[-1]["role"] == "tool":
                self.told.append(messages[-1]["content"])
                return ServerReply(text="Told them.")
            self.alerts += 1
            if self.alerts > 1:  # a later fire has nothing to say
                return ServerReply(text="Nothing new.")
            alert = [("message", {"text": ALERT})]
            return ServerReply(tool_calls=alert, stall_after_events=0, resume=self.personal_runs)
        self.personal.append(body)
        if len(self.personal) == 1:
            self.personal_runs.set()
            return ServerReply(hang=True)
        return ServerReply(text="Fixed.")


def _rows(key: str) -> list[StoredMessage]:
    store = Store(Settings.load().paths.db)
    try:
        conversation = store.conversation(key)
        return [] if conversation is None else store.branch(conversation.id)
    finally:
        store.close()


def _text(m: dict[str, Any]) -> str:
    c = m["content"]
    return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c)


@pytest.mark.slow  # real processes
async def test_a_message_waiting_for_a_turn_survives_a_kill_9_of_the_serve(heron_home):
    store = Store(Settings.load().paths.db)
    hourly = parse(every="1h", timezone="UTC")  # due at once when the serve starts, then not
    job = js.create_job(store, hourly, conversation="personal", prompt="Is CI green?",
                        now=time.time() - 3605, mode="monitor")  # fmt: skip
    store.close()
    label = f"[Sent to the user by scheduled job {job.id} (a monitor), not written by the user] "
    model = Model()
    with FakeOpenAIServer(model) as server:
        env = {"HERON_BASE_URL": server.base_url, "HERON_API_KEY": "dummy",
               "HERON_MODEL": "fake-model", "HERON_EMBEDDINGS": "0"}  # fmt: skip
        with ServeProcess(heron_home, env) as serve:
            client = await LineClient.open(heron_home / SOCKET_NAME)
            await client.send({"type": "hello", "conversation": "personal", "last_seq": None})
            await client.send({"type": "send", "text": "hello"})
            said = await client.until("message")  # live, at once, while the turn runs
            await until(lambda: model.told, timeout=WAIT)
            assert not any(r.meta.get(RELAY_META) for r in _rows("personal"))  # not inside it
            assert serve.proc is not None
            serve.proc.kill()  # -9, the turn in `personal` still running
            serve.proc.wait(30)
            await client.close()
        with ServeProcess(heron_home, env):
            # The restarted serve moves it in at start, before any turn there.
            await until(lambda: any(r.meta.get(RELAY_META) for r in _rows("personal")), WAIT)
            client = await LineClient.open(heron_home / SOCKET_NAME)
            await client.send({"type": "hello", "conversation": "personal", "last_seq": None})
            await client.send({"type": "send", "text": "fix it"})
            await client.until("turn_end")
            await client.close()
    assert said[-1]["text"] == ALERT
    assert model.told == [
        "Delivered: shown to the user now, and kept in conversation 'personal' once the turn"
        " running there ends."
    ]
    rows = _rows("personal")
    relayed = [i for i, r in enumerate(rows) if r.meta.get(RELAY_META)]
    assert len(relayed) == 1  # once
    row = rows[relayed[0]]
    assert (row.author, row.role, row.message.text) == ("heron", "user", ALERT)
    assert row.wire.text == label + ALERT and row.meta[RELAY_META] == f"cron:{job.id}"
    texts = [r.message.text for r in rows]
    # After the killed turn (its message, and the mark that it was stopped), before the next.
    assert texts.index("hello") < relayed[0] < texts.index("fix it")
    assert texts[-1] == "Fixed."
    # The next turn's request holds it, labelled, before the person's new message.
    sent = [(m["role"], _text(m)) for m in model.personal[-1]["messages"]]
    alert_at = sent.index(("user", label + ALERT))
    asked_at = next(i for i, (role, t) in enumerate(sent) if role == "user" and "fix it" in t)
    assert alert_at < asked_at
    store = Store(Settings.load().paths.db)
    assert store.query("SELECT COUNT(*) FROM waiting_messages")[0][0] == 0
    store.close()


@pytest.mark.slow  # real processes
def test_what_a_dead_process_left_waiting_goes_in_before_an_in_process_run_reads_history(
    heron_home,
):
    """No serve runs: the next turn's RESTORE, in a `heron run` of its own, moves in what waits
    (here: left by a serve killed after the turn it waited for had ended, before it moved it
    in), before the history is read."""
    with FakeOpenAIServer([ServerReply(text="Hi."), ServerReply(text="Fixed.")]) as server:
        model = {"HERON_BASE_URL": server.base_url, "HERON_API_KEY": "d",
                 "HERON_MODEL": "fake-model", "HERON_EMBEDDINGS": "0"}  # fmt: skip
        env = clean_env(heron_home, model)

        def run(text: str) -> None:
            argv = [sys.executable, "-m", "heron", "run", "-c", "personal", text]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr

        run("hello")
        store = Store(Settings.load().paths.db)
        waiting.hold(store, "personal", "default", ALERT, "scheduled job 7 (a monitor)", "cron:7")
        store.close()
        run("fix it")
    label = "[Sent to the user by scheduled job 7 (a monitor), not written by the user] "
    sent = [(m["role"], _text(m)) for m in server.requests[1]["messages"]]
    alert_at = sent.index(("user", label + ALERT))
    assert sent[alert_at - 1] == ("assistant", "Hi.")  # appended: the earlier request's prefix
    assert "fix it" in sent[alert_at + 1][1]
    texts = [r.message.text for r in _rows("personal")]
    assert texts == ["hello", "Hi.", ALERT, "fix it", "Fixed."]
    store = Store(Settings.load().paths.db)
    assert waiting.waiting_for(store, "personal") == []
    store.close()
