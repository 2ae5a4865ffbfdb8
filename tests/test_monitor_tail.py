"""A monitor's conversation `cron:<id>` stays bounded as the heartbeat's does: after
`tail_turns` checks the next one writes a separator (at BUILD, under its own lease) and carries
the last check's closing note, so requests stop growing with every check and the model still
knows what it found before; a separator never lands inside a turn, even with fires queued."""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

from schedule_helpers import answer, call, last_user_text, rig

from heron.bus import InboundMessage, TurnOptions
from heron.messages import Reply, Text
from heron.proactive.scheduler import CHANNEL, TAIL_TURNS
from heron.providers.base import ChatRequest
from heron.store import Store
from heron.store import jobs as js
from heron.store.schedule import parse

BERLIN = ZoneInfo("Europe/Berlin")
START = dt.datetime(2026, 6, 1, 8, 0, tzinfo=BERLIN).timestamp()
HOUR = 3600.0
CARRIED = re.compile(r"\[Your previous check, \d{4}-\d\d-\d\d \d\d:\d\d, ended: (.*)\]")


def monitor(store: Store, now: float) -> js.Job:
    when = parse(every="1h", timezone="Europe/Berlin")
    return js.create_job(
        store, when, conversation="chat-1", prompt="Tell me when the build turns red.",
        now=now, mode="monitor", created_by="test",
    )  # fmt: skip


def checks() -> tuple[list[int], object]:
    """A model that notes which check it is on: 'Build green (check N).'"""
    count = [0]

    def reply(_: ChatRequest) -> Reply:
        count[0] += 1
        return answer(f"Build green (check {count[0]}).")

    return count, reply


async def test_twenty_fires_of_a_monitor_send_a_bounded_tail_and_carry_the_last_note():
    _, script = checks()
    async with rig(script, START) as r:
        job = monitor(r.engine.store, r.clock.now())
        for n in range(1, 21):
            await r.at(START + n * HOUR)
        runs = js.runs(r.engine.store, job.id)
        assert len(runs) == 20 and {run.status for run in runs} == {"done"}
        sizes = [len(q.messages) for q in r.provider.requests]
        assert len(sizes) == 20
        # Each check is a prompt and a reply: at most TAIL_TURNS earlier ones and its own.
        assert max(sizes) <= 2 * TAIL_TURNS + 1
        assert sizes[-1] < sizes[TAIL_TURNS - 1]  # not growing: it started afresh since
        prompts = [last_user_text(q) for q in r.provider.requests]
        carried = [(n, CARRIED.search(p)) for n, p in enumerate(prompts, 1)]
        found = [(n, m.group(1)) for n, m in carried if m]
        # The check after each separator is told how the one before it ended (and when).
        assert found == [
            (TAIL_TURNS + 1, f"Build green (check {TAIL_TURNS})."),
            (2 * TAIL_TURNS + 1, f"Build green (check {2 * TAIL_TURNS})."),
        ]
        # What the model sees after a separator starts with that prompt: the note is in it.
        first_after = r.provider.requests[TAIL_TURNS]
        assert "ended: Build green (check 8)." in last_user_text(first_after)
        assert len(first_after.messages) <= 2
        rows = r.engine.store.branch(r.engine.store.conversation(f"cron:{job.id}").id)
        assert [row.kind for row in rows].count("separator") == 2


def turns_whole(rows) -> None:
    """Every separator sits between two turns: after a turn's final reply, before the next
    turn's message, never between a call and its result or a turn's message and its reply."""
    for i, row in enumerate(rows):
        if row.kind != "separator":
            continue
        before, after = rows[i - 1], rows[i + 1]
        assert before.role == "assistant" and not before.message.tool_calls
        assert after.role == "user" and after.turn_id != before.turn_id
        assert all(r.turn_id != before.turn_id for r in rows[i + 1 :])


async def test_fires_queued_behind_each_other_never_get_a_separator_inside_a_turn():
    def script(q: ChatRequest) -> Reply:
        last = q.messages[-1]
        if last.role == "user" and any(isinstance(p, Text) for p in last.parts):
            return call("schedule", {"action": "list"})  # a tool phase inside every check
        return answer("Checked: build green.")

    async with rig(script, START, run_scheduler=False) as r:
        options = TurnOptions(fresh_after=2)
        for n in range(7):  # published at once: the loop queues them behind the first
            await r.bus.publish(
                InboundMessage(
                    CHANNEL, "chat-1", f"[Scheduled check {n}] Is the build red?",
                    key="cron:77", provenance="scheduled", options=options,
                )
            )  # fmt: skip
        await r.bus.inbound.join()  # no scheduler waits on the clock: `settle` would not end
        await r.loop.wait_idle()
        store = r.engine.store
        conversation = store.conversation("cron:77")
        assert conversation is not None
        rows = store.branch(conversation.id)
        assert [row.kind for row in rows].count("separator") == 3  # before checks 3, 5, 7
        turns_whole(rows)
        assert all(len(q.messages) <= 2 * 3 + 2 for q in r.provider.requests)
        carried = [
            row for row in rows if row.role == "user" and "ended: Checked" in row.message.text
        ]
        assert len(carried) == 3 and all(row.author == "heron" for row in carried)
