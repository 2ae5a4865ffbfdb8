"""A turn cut off by kill -9 is closed by the next process (RESTORE, `close_dead_turns`): its
row then counts the calls the trace recorded, not zeros (`heron conversations show` listed
`interrupted · 0 model calls, 0 tool calls · tokens in 0` above the calls it made)."""

from __future__ import annotations

import time

import pytest

from heron.config import Settings
from heron.messages import Message, Text
from heron.store import Store
from heron.store import engine_state as es
from heron.trace import records

# Once per backend: SQLite, and PostgreSQL (tests/pg.py).
pytestmark = pytest.mark.usefixtures("home_db")


def test_a_turn_a_dead_process_left_counts_the_calls_its_trace_recorded():
    store = Store(Settings.load().database)
    try:
        conv = store.open_conversation("killed")
        turn, _ = store.begin_turn(conv.id, "run-killed", Message("user", [Text("go")]))
        now = time.time()
        with store.transaction() as c:  # as the recorder wrote them before the kill
            for seq, ended in ((1, now), (2, None)):  # the second was cut mid-call
                row = (turn, seq, "turn", None, None, None, 1200, 30, 1000, 0, now, ended, None)
                records.insert_model_call(c, row)
            tool = (turn, "call_1", "bash", "{}", "ok", None, 0, None, now, now, 1)
            records.insert_tool_call(c, tool)
        es.recover(store, conv.id, "[This turn was stopped before it finished.]")
        (found,) = store.turns(conv.id)
    finally:
        store.close()
    assert found.status == "interrupted"
    assert (found.model_calls, found.tool_calls) == (2, 1)
    assert (found.usage.input, found.usage.output, found.usage.cache_read) == (2400, 60, 2000)
    assert found.usage_unknown  # a call cut before its usage came: a floor
