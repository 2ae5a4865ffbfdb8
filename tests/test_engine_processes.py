"""Across OS processes: two writers never interleave turns of one conversation, and kill -9 at
random instants loses no committed message and always leaves a history the provider accepts."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from heron.context.repair import is_well_formed
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # several OS processes and kill -9

CHILD = """
import asyncio, sys
from heron.agent.engine import Engine, TurnHooks
from heron.config import Settings

async def main(key, prefix, count, until):
    async with Engine.open(Settings.load()) as engine:
        print("ready", flush=True)  # the parent's kill instants count from here
        hooks = TurnHooks(on_busy=lambda note: print(note, file=sys.stderr, flush=True))
        n = 0
        while True:
            conv = engine.store.conversation(key)
            done = len(engine.store.turns(conv.id)) if conv else 0
            if (until and done >= until) or (count and n >= count):
                return
            result = await engine.turn(key, f"{prefix} {done if until else n}", hooks)
            assert result.ok, result.run.error
            n += 1

key, prefix, count, until = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
asyncio.run(main(key, prefix, count, until))
"""


def _env(base_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HERON_BASE_URL=base_url, HERON_MODEL="fake-model", HERON_API_KEY="k")
    return env


def _spawn(env: dict[str, str], *args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _db() -> Path:
    return Path(os.environ["HERON_HOME"]) / "heron.db"


def _reply_for(body: dict[str, Any]) -> ServerReply:
    """Every user message gets a tool call (list_files), every tool result a text answer."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return ServerReply(text="done", delay_s=0.02)
    return ServerReply(tool_calls=[("list_files", {})], delay_s=0.03)


def test_two_processes_on_one_conversation_never_interleave_turns():
    Store(_db()).close()  # migrate first: two processes creating one database race
    with FakeOpenAIServer(_reply_for) as server:
        env = _env(server.base_url)
        procs = [_spawn(env, "shared", name, 4, 0) for name in ("A", "B")]
        outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    store = Store(_db())
    conv = store.conversation("shared")
    turns = store.turns(conv.id)
    branch = store.branch(conv.id)
    assert len(turns) == 8 and {t.status for t in turns} == {"done"}
    spans = sorted((t.started, t.ended) for t in turns)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    # On the branch, each turn's rows are one contiguous block: question, call, result, answer.
    turn_ids = [r.turn_id for r in branch]
    blocks = [t for i, t in enumerate(turn_ids) if i == 0 or turn_ids[i - 1] != t]
    assert len(blocks) == len(set(blocks)) == 8
    assert [r.role for r in branch] == ["user", "assistant", "user", "assistant"] * 8
    # Someone waited: the loser of a race was told, then continued from what was saved.
    assert any("busy in another session" in err for _, err in outs)
    assert is_well_formed([r.wire for r in branch])


def _snapshot(store: Store, conversation_id: int) -> dict[int, tuple]:
    rows = store.query(
        "SELECT id, parent_id, role, parts FROM messages WHERE conversation_id = ?",
        (conversation_id,),
    )
    return {r[0]: tuple(r) for r in rows}


def _openai_well_formed(messages: list[dict[str, Any]]) -> bool:
    """Every assistant tool call is answered by tool messages right after it, and every tool
    message answers a call of the assistant message before it."""
    pending: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            if m["tool_call_id"] not in pending:
                return False
            pending.discard(m["tool_call_id"])
            continue
        if pending:
            return False
        if m["role"] == "assistant":
            pending = {c["id"] for c in m.get("tool_calls") or []}
    return not pending


def test_kill_minus_nine_at_random_instants_loses_nothing_and_resumes_well_formed():
    rng = random.Random(5)
    total_turns, kills = 50, 20
    seen: dict[int, tuple] = {}
    with FakeOpenAIServer(_reply_for) as server:
        env = _env(server.base_url)
        for _ in range(kills):
            proc = _spawn(env, "crashy", "turn", 0, total_turns)
            # From when its engine is open, not from the spawn: on a busy machine the start
            # alone can outlast a fixed delay, and then no kill would land mid-turn.
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.8))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            store = Store(_db())
            conv = store.conversation("crashy")
            now = _snapshot(store, conv.id) if conv else {}
            store.close()
            lost = {i: row for i, row in seen.items() if now.get(i) != row}
            assert not lost, f"committed rows changed or vanished: {lost}"
            seen = now
        final = _spawn(env, "crashy", "turn", 0, total_turns)
        _, err = final.communicate(timeout=60)
        assert final.returncode == 0, err
        requests = list(server.requests)
    store = Store(_db())
    conv = store.conversation("crashy")
    branch = store.branch(conv.id)
    typed = [r.message.text for r in branch if r.role == "user" and not r.message.tool_results]
    turns = store.turns(conv.id)
    assert len(turns) >= total_turns
    assert any(t.status == "interrupted" for t in turns)  # some kills did land mid-turn
    assert all(f"turn {i}" in typed for i in range(total_turns))
    assert all(_snapshot(store, conv.id).get(i) == row for i, row in seen.items())
    assert is_well_formed([r.wire for r in branch])
    bad = [i for i, body in enumerate(requests) if not _openai_well_formed(body["messages"])]
    assert not bad, json.dumps(requests[bad[0]]["messages"])[-2000:]
