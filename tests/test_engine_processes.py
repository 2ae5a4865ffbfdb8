"""Across OS processes, on both backends (fixture `home_db`: SQLite's file, or a PostgreSQL
schema every process reaches through HERON_DATABASE_URL): two writers never interleave turns of
one conversation, two engines sharing fifty conversations never overlap within one, a
follow-up or a /stop from another process finds the running turn, and kill -9 at random
instants loses no committed message and always leaves a history the provider accepts. The
processes are tests/engine_child.py."""

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
from pg import raw_count
from procs import reap, spawn, start_together  # noqa: F401  (reap: an autouse fixture)

from heron.agent.turn import STOPPED
from heron.context.repair import is_well_formed
from heron.store import Store
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply

pytestmark = pytest.mark.slow  # several OS processes and kill -9

CHILD = str(Path(__file__).with_name("engine_child.py"))
# How long a child may take to finish its turns: a bound that makes a hung child fail the test,
# not a speed (on PostgreSQL at load 18, four turns took over a minute).
CHILD_WAIT_S = 180


def _env(base_url: str = "") -> dict[str, str]:
    env = dict(os.environ)  # HERON_HOME, and HERON_DATABASE_URL on PostgreSQL (`home_db`)
    if base_url:
        env.update(HERON_BASE_URL=base_url, HERON_MODEL="fake-model", HERON_API_KEY="k")
    return env


def _spawn(env: dict[str, str], *args: Any) -> subprocess.Popen[str]:
    return spawn([sys.executable, CHILD, *map(str, args)], env)


def _reply_for(body: dict[str, Any]) -> ServerReply:
    """Every user message gets a tool call (list_files), every tool result a text answer."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return ServerReply(text="done", delay_s=0.02)
    return ServerReply(tool_calls=[("list_files", {})], delay_s=0.03)


def test_two_processes_on_one_conversation_never_interleave_turns(home_db):
    Store(home_db).close()  # migrate first (on SQLite two processes creating one file race)
    with FakeOpenAIServer(_reply_for) as server:
        env = _env(server.base_url)
        procs = [_spawn(env, "turns", "shared", name, 4, 0) for name in ("A", "B")]
        outs = [p.communicate(timeout=CHILD_WAIT_S) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    store = Store(home_db)
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


def _kept(db: str | Path, key: str, seen: dict[int, tuple[Any, ...]]) -> dict[int, tuple[Any, ...]]:
    """The conversation's rows now, after checking that every row `seen` before is still
    there, unchanged."""
    store = Store(db)
    conv = store.conversation(key)
    now = _snapshot(store, conv.id) if conv else {}
    store.close()
    lost = {i: row for i, row in seen.items() if now.get(i) != row}
    assert not lost, f"committed rows changed or vanished: {lost}"
    return now


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


def test_kill_minus_nine_at_random_instants_loses_nothing_and_resumes_well_formed(home_db):
    rng = random.Random(5)
    total_turns, kills = 50, 12  # each kill is a process start: about a second of CPU
    seen: dict[int, tuple] = {}
    with FakeOpenAIServer(_reply_for) as server:
        env = _env(server.base_url)
        for _ in range(kills):
            proc = _spawn(env, "turns", "crashy", "turn", 0, total_turns)
            # From when its engine is open, not from the spawn: on a busy machine the start
            # alone can outlast a fixed delay, and then no kill would land mid-turn.
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.8))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            seen = _kept(home_db, "crashy", seen)
        final = _spawn(env, "turns", "crashy", "turn", 0, total_turns)
        _, err = final.communicate(timeout=CHILD_WAIT_S)
        assert final.returncode == 0, err
        requests = list(server.requests)
    store = Store(home_db)
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


def test_two_engines_sharing_fifty_conversations_never_overlap_within_one(home_db):
    """The engine's correctness load (tests/test_engine_loop.py, fifty conversations of five
    turns) split over two engine processes, each with its own AgentLoop: A sends three turns
    and B two to every conversation, each its next after its previous answer."""
    conversations, shares = 50, {"a": 3, "b": 2}
    Store(home_db).close()
    procs = [_spawn(_env(), "load", n, conversations, k, 0.05) for n, k in shares.items()]
    outs = [out for out, _ in start_together(procs, timeout=300)]
    reports = {n: json.loads(out.splitlines()[-1]) for n, out in zip(shares, outs, strict=True)}
    for name, report in reports.items():
        assert not report["errors"] and not report["overlaps"]
        assert len(report["answers"]) == conversations
        for chat, said in report["answers"].items():  # each process's answers in its order
            assert said == [f"ok {chat} {name}{j}" for j in range(shares[name])]
    store = Store(home_db)
    rows = store.query("SELECT conversation_id, started, ended, status FROM turns")
    assert len(rows) == conversations * 5 and {r["status"] for r in rows} == {"done"}
    by_conv: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        by_conv.setdefault(r["conversation_id"], []).append((r["started"], r["ended"]))
    for cid, spans in by_conv.items():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
        branch = store.branch(cid)
        assert [r.role for r in branch] == ["user", "assistant"] * 5
        assert all(branch[i].turn_id == branch[i + 1].turn_id for i in range(0, 10, 2))
    # The two processes did meet on the same conversations, and one waited for the other.
    assert reports["a"]["busy"] + reports["b"]["busy"] > 0


def _until_row(db: str | Path, sql: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not raw_count(db, sql):
        assert time.monotonic() < deadline, f"never true: {sql}"
        time.sleep(0.05)


def test_a_follow_up_from_another_process_waits_and_sees_the_turn(home_db):
    """A message sent from a second process while the first runs a turn is not lost nor
    interleaved: it waits ("busy"), then its turn sees the first turn's tool result and
    answer."""
    Store(home_db).close()
    first = _spawn(_env(), "gate", "shared", "start the job")
    _until_row(home_db, "SELECT COUNT(*) FROM checkpoints")  # mid-turn: `quick` finished
    second = _spawn(_env(), "say", "shared", "also, make it blue")
    assert second.stdout is not None and second.stdout.readline().strip() == "busy"
    (Path(os.environ["HERON_HOME"]) / "gate").touch()
    out1, err1 = first.communicate(timeout=CHILD_WAIT_S)
    out2, err2 = second.communicate(timeout=CHILD_WAIT_S)
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    assert json.loads(out1)["reply"] == "gate done"
    seen = json.loads(out2)["seen"]
    results = {r[0]: r[1] for m in seen for r in m["results"]}
    assert results == {"a": "quick 1 done", "b": "gate passed"}
    assert [m["text"] for m in seen if m["role"] == "assistant"][-1] == "gate done"
    assert "also, make it blue" in seen[-1]["text"]
    store = Store(home_db)
    spans = sorted((t.started, t.ended) for t in store.turns(store.conversation("shared").id))
    assert len(spans) == 2 and spans[0][1] <= spans[1][0]


def test_stop_from_another_process_keeps_finished_tool_results(home_db):
    """/stop sent from a second process stops the running turn as a /stop in its own process
    would: what its tools finished before the stop is kept, the unfinished call is closed as
    interrupted with the minimal stopped reply, nothing the turn does after is written, and the
    next turn sees the finished result. Whether the gate opens before the turn notices (its
    next commit is refused) or after (its watch of the epoch cancels it), the record is the
    same."""
    Store(home_db).close()
    first = _spawn(_env(), "gate", "shared", "do two things")
    _until_row(home_db, "SELECT COUNT(*) FROM checkpoints")  # `quick` done, `wait_gate` waits
    store = Store(home_db)
    before = _rows(store)  # before the stop: the stopped turn may close at once after it
    stop = _spawn(_env(), "say", "shared", "/stop")
    out, err = stop.communicate(timeout=CHILD_WAIT_S)
    assert stop.returncode == 0, err
    assert "What it finished is kept" in json.loads(out)["reply"]
    (Path(os.environ["HERON_HOME"]) / "gate").touch()
    out1, err1 = first.communicate(timeout=CHILD_WAIT_S)
    assert first.returncode == 0, err1
    assert json.loads(out1)["outcome"] == "stale"
    after = _rows(store)
    assert after["model_calls"] == before["model_calls"]  # no call of the turn after it
    # The trace names the call the stop cut, as the conversation does (interrupted, its result
    # the stopped text): one row more, for `wait_gate`, and nothing else.
    assert after["tool_calls"][: len(before["tool_calls"])] == before["tool_calls"]
    (cut,) = after["tool_calls"][len(before["tool_calls"]) :]
    assert cut[2:4] == ("b", "wait_gate") and "interrupted" in str(cut[5])
    assert after["checkpoints"] == []  # taken into the record by the closing
    assert after["messages"][: len(before["messages"])] == before["messages"]
    conv = store.conversation("shared")
    closing = [m.message for m in store.branch(conv.id)][len(before["messages"]) :]
    assert [m.role for m in closing] == ["user", "assistant"]
    assert closing[0].tool_results[0].content == "quick 1 done"
    assert closing[1].text == STOPPED  # nothing streamed: the turn's minimal stopped reply
    after_turn = _spawn(_env(), "say", "shared", "what happened?")
    out3, err3 = after_turn.communicate(timeout=CHILD_WAIT_S)
    assert after_turn.returncode == 0, err3
    seen = json.loads(out3)["seen"]
    results = {r[0]: (r[1], r[2]) for m in seen for r in m["results"]}
    assert results["a"] == ("quick 1 done", False)
    assert results["b"][1] and "interrupted" in results["b"][0]
    assert [t.status for t in store.turns(conv.id)] == ["interrupted", "done"]
    assert is_well_formed([r.wire for r in store.branch(conv.id)])


def _rows(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """What a stale turn must not add to: messages, tool calls (but the trace's row of the call
    a stop cut), model calls, checkpoints."""
    return {
        table: [tuple(r) for r in store.query(f"SELECT * FROM {table} ORDER BY 1")]
        for table in ("messages", "tool_calls", "model_calls", "checkpoints")
    }


def test_kill_minus_nine_of_one_of_two_processes_loses_nothing(home_db):
    """Two engine processes on one conversation; one of them is killed at random instants and
    started again, the other runs on. Every message either committed stays as it was, the
    survivor takes over each dead holder's lease and finishes all its turns, and the history
    stays one the provider accepts."""
    rng = random.Random(7)
    Store(home_db).close()
    saved: set[int] = set()
    seen: dict[int, tuple[Any, ...]] = {}
    with FakeOpenAIServer(_reply_for) as server:
        env = _env(server.base_url)
        survivor = _spawn(env, "turns", "shared", "steady", 30, 0)
        assert survivor.stdout is not None and survivor.stdout.readline().strip() == "ready"
        for k in range(8):
            proc = _spawn(env, "turns", "shared", f"crash{k}", 1000, 0)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.1, 1.0))
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=10)
            saved |= {int(line.split()[1]) for line in out.splitlines() if line.startswith("saved")}
            seen = _kept(home_db, "shared", seen)
        out, err = survivor.communicate(timeout=300)
        assert survivor.returncode == 0, err[-3000:]
        # Resumable: a turn after the last kill closes whatever it left open.
        final = _spawn(env, "turns", "shared", "final", 1, 0)
        _, err = final.communicate(timeout=CHILD_WAIT_S)
        assert final.returncode == 0, err[-3000:]
        requests = list(server.requests)
    store = Store(home_db)
    conv = store.conversation("shared")
    rows = _snapshot(store, conv.id)
    assert all(rows.get(i) == row for i, row in seen.items())
    assert saved and saved <= set(rows)  # every message a killed process saw committed
    turns = store.turns(conv.id)
    said = {t.id: store.message(t.user_message_id).message.text for t in turns}
    steady = [t for t in turns if "steady" in said[t.id]]
    assert len(steady) == 30 and {t.status for t in steady} == {"done"}
    assert turns[-1].status == "done" and "final" in said[turns[-1].id]
    assert any(t.status == "interrupted" for t in turns)  # kills did land mid-turn
    spans = sorted((t.started, t.ended) for t in turns if t.ended is not None)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert not store.query("SELECT 1 FROM turns WHERE status = 'running'")
    branch = store.branch(conv.id)
    assert is_well_formed([r.wire for r in branch])
    bad = [i for i, body in enumerate(requests) if not _openai_well_formed(body["messages"])]
    assert not bad, json.dumps(requests[bad[0]]["messages"])[-2000:]


def test_a_maintenance_run_whose_process_is_killed_shows_interrupted_in_trace_ls(home_db):
    """A process killed with -9 in the middle of a maintenance run (a /learn's second call):
    no lease says it is dead, its row's process does, and the next `heron trace ls` shows the
    run interrupted with the calls it made counted (its usage unknown: a call was in flight),
    not running for good."""
    from typer.testing import CliRunner

    from heron.cli import app

    Store(home_db).close()
    proc = _spawn(_env(), "maintain", "upkeep")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "calling"
    store = Store(home_db)
    try:
        (run,) = store.turns(store.conversation("upkeep").id, maintenance=True)
        assert run.status == "running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        store.close()
        shown = CliRunner().invoke(app, ["trace", "ls", "--conversation", "upkeep"])
        assert shown.exit_code == 0, shown.output
        (line,) = shown.stdout.splitlines()[1:]
        assert "interrupted (learn)" in line and "running" not in line
        store = Store(home_db)
        (run,) = store.turns(store.conversation("upkeep").id, maintenance=True)
        assert (run.status, run.model_calls, run.usage.input) == ("interrupted", 1, 300)
        assert run.usage_unknown and "killed or crashed" in (run.error or "")
    finally:
        store.close()
