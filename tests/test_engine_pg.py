"""The engine's ordinary scripted turns on a PostgreSQL store (marker `pg`).

Each test here is an existing engine test, imported under a name that says what it proves, and
run with `HERON_DATABASE_URL` naming a schema of its own on the real server tests/pg.py starts:
the same assertions, the other backend. The autouse fixture checks afterwards that the turns
really were written to PostgreSQL, so a test that quietly opened the SQLite file fails here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import test_engine_loop
from pg import raw_count
from test_engine import (
    test_failed_turn_keeps_the_users_message as test_a_failed_turn_keeps_the_users_message,
)
from test_engine import (
    test_turn_persists_everything_and_second_turn_sees_first as test_a_turn_with_a_tool_call,
)
from test_engine_commands import (
    test_retry_and_edit_branch_and_keep_the_replaced_answers as test_retry_and_edit_branch,
)
from test_engine_loop import (
    test_concurrent_turns_on_one_key_are_serialized_by_the_lease as test_one_turn_at_a_time,
)
from test_engine_loop import (
    test_follow_up_sent_mid_turn_is_answered_in_the_same_turn as test_a_follow_up_mid_turn,
)
from test_serve_elsewhere import (
    test_the_leases_and_the_turns_the_watcher_reads as test_what_a_serve_reads_of_other_turns,
)

pytestmark = pytest.mark.pg

test_stop_keeps_tool_results = test_engine_loop.test_stop_during_a_tool_keeps_finished_results_and_the_stale_turn_writes_nothing  # noqa: E501

__all__ = [
    "test_a_failed_turn_keeps_the_users_message",
    "test_a_follow_up_mid_turn",
    "test_a_turn_with_a_tool_call",
    "test_one_turn_at_a_time",
    "test_retry_and_edit_branch",
    "test_stop_keeps_tool_results",
    "test_what_a_serve_reads_of_other_turns",
]


@pytest.fixture(autouse=True)
def on_postgres(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every engine the test opens uses this test's PostgreSQL schema; afterwards, its turns
    must be there."""
    monkeypatch.setenv("HERON_DATABASE_URL", pg_url)
    yield pg_url
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns"), "no turn reached PostgreSQL"
