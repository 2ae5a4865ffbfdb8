"""Turns as DBOS workflows on real `heron worker` processes and a real PostgreSQL (issue 18):
one turn per conversation at a time across workers, a follow-up during a turn, /stop, a worker
killed mid-turn whose turn another finishes, a scheduled job firing once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pg import raw_count
from scale_helpers import Workers, face, model_server, worker_env

from heron.testing.script import ServerReply

pytestmark = [pytest.mark.pg, pytest.mark.slow]


def _last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body["messages"]):
        if m["role"] == "user":
            c = m["content"]
            return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c)
    return ""


def echo(body: dict[str, Any]) -> ServerReply:
    return ServerReply(text="answer to " + _last_user_text(body).splitlines()[0][:60])


async def test_two_workers_answer_every_turn_in_order(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with model_server(echo) as (_, url):
        workers = Workers(worker_env(heron_home, pg_url, url))
        try:
            workers.start(2)
            async with face(pg_url, monkeypatch) as f:
                for turn in range(2):
                    for c in range(3):
                        f.send(f"c{c}", f"message {turn} of c{c}")
                await f.settle()
                assert f.kinds("c0").count("turn_end") == 2
        finally:
            workers.stop()
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns WHERE status = 'done'") == 6
