"""Turns as DBOS workflows on real `heron worker` processes and a real PostgreSQL (issue 18):
one turn per conversation at a time across workers, a follow-up during a turn, /stop, a worker
killed mid-turn whose turn another finishes, a scheduled job firing once."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pg import raw_count
from scale_helpers import Workers, face, model_server, on_workers, worker_env

from heron.agent.control import MAIL_LABEL, MAIL_META
from heron.bus import TurnEvent
from heron.testing.script import Script, ServerReply

pytestmark = [pytest.mark.pg, pytest.mark.slow]


def _last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body["messages"]):
        if m["role"] == "user":
            c = m["content"]
            return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c)
    return ""


def echo(body: dict[str, Any]) -> ServerReply:
    return ServerReply(text="answer to " + _last_user_text(body).splitlines()[0][:60])


def _dbos_count(pg_url: str, where: str) -> object:
    """A count over DBOS's workflow table of this test's schema."""
    table = _dbos_schema(pg_url) + ".workflow_status"
    return raw_count(pg_url.split("?")[0], f"SELECT COUNT(*) FROM {table} WHERE {where}")


OVERLAPS = (  # pairs of turns of one conversation where the later started before the other ended
    "SELECT COUNT(*) FROM turns a JOIN turns b ON a.id < b.id"
    " WHERE a.conversation_id = b.conversation_id AND b.started < a.ended"
)


async def test_fifty_conversations_of_five_turns_over_two_workers_never_overlap(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's correctness load (tests/test_engine_loop.py) on 2 workers: every message
    of every conversation sent at once through the face (which enqueues conversations
    concurrently, each one's messages in order), so only the queue's partitions keep a
    conversation's turns apart; each answered once, in order, by whichever worker was free.
    The messages are reminders, which never join a running turn as mail: each is a turn."""
    conversations, turns = 50, 5
    async with on_workers(echo, heron_home, pg_url, monkeypatch) as (_, _, f):
        for t in range(turns):
            for c in range(conversations):
                f.send(f"c{c}", f"c{c} t{t}", provenance="reminder")
        await f.settle(400)
    for c in range(conversations):
        assert f.texts("answer", f"c{c}") == [f"answer to c{c} t{t}" for t in range(turns)]
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns WHERE status = 'done'") == 250
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns") == 250
    assert raw_count(pg_url, OVERLAPS) == 0
    assert _dbos_count(pg_url, "status = 'SUCCESS'") == 250
    # Both workers took turns (how many each is up to the queue).
    table = _dbos_schema(pg_url) + ".workflow_status"
    executors = f"SELECT COUNT(DISTINCT executor_id) FROM {table}"
    assert raw_count(pg_url.split("?")[0], executors) == 2


async def test_two_workers_answer_every_turn_in_order(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with on_workers(echo, heron_home, pg_url, monkeypatch) as (_, _, f):
        for turn in range(2):
            for c in range(3):
                f.send(f"c{c}", f"message {turn} of c{c}")
        await f.settle()
        assert f.kinds("c0").count("turn_end") == 2
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns WHERE status = 'done'") == 6


def _tool_then_answer(slow_second: dict[str, float]) -> Any:
    """First call: a bash tool call that appends to ran.txt; second: the answer, held for
    `slow_second[key]` seconds the first time it is asked (a turn to stop or kill mid-call)."""

    def script(body: dict[str, Any]) -> ServerReply:
        roles = [m["role"] for m in body["messages"]]
        last_user = len(roles) - 1 - roles[::-1].index("user")
        user = _last_user_text(body).splitlines()[0]
        if "tool" not in roles[last_user:]:
            if user.startswith("work"):
                return ServerReply(tool_calls=[("bash", {"command": "echo ran >> ran.txt"})])
            return ServerReply(text="answer to " + user[:40])
        key = user.split()[-1]
        wait = slow_second.pop(key, 0.0)
        return ServerReply(text="finished " + key, delay_s=wait)

    return script


async def test_a_worker_killed_mid_turn_is_finished_by_another_without_repeating_the_tool(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = {"k1": 60.0}
    async with on_workers(_tool_then_answer(slow), heron_home, pg_url, monkeypatch) as (
        server,
        workers,
        f,
    ):
        f.send("k1", "work on k1")
        # The second model call is asked (the tool ran and was kept), and held.
        await f.wait_for(lambda: len(server.requests) >= 2)
        owner = raw_count(
            pg_url.split("?")[0],
            "SELECT executor_id FROM " + _dbos_schema(pg_url) + ".workflow_status"
            " WHERE status = 'PENDING'",
        )
        pid = int(str(owner).split("-")[-2])
        workers.kill(pid)
        await f.settle(240)
        answers = [e.text for e in f.events if getattr(e, "kind", "") == "answer" and e.key == "k1"]
    ran = (heron_home / "workspace" / "ran.txt").read_text().splitlines()
    assert ran == ["ran"], "the finished tool call ran again"
    assert answers == ["finished k1"], [
        (type(e).__name__, getattr(e, "kind", ""), e.text[:50]) for e in f.events
    ]
    statuses = raw_count(
        pg_url,
        "SELECT string_agg(status || ':' || COALESCE(stop_reason, ''), ',' ORDER BY id) FROM turns",
    )
    assert statuses == "interrupted:recovered,done:done"
    results = raw_count(
        pg_url, "SELECT COUNT(*) FROM messages WHERE parts LIKE ?", ("%tool_result%",)
    )
    assert results == 1  # the kept result, once: no orphaned call, no second run


def _dbos_schema(pg_url: str) -> str:
    from heron.scale.cluster import cluster_of

    return cluster_of(pg_url).dbos_schema


async def test_stop_cancels_the_workflow_and_keeps_the_tool_result(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = {"s1": 60.0}
    async with on_workers(_tool_then_answer(slow), heron_home, pg_url, monkeypatch, n=1) as (
        server,
        _,
        f,
    ):
        f.send("s1", "work on s1")
        await f.wait_for(lambda: len(server.requests) >= 2)
        await f.wait_for(lambda: f.loop.running("s1"))
        f.send("s1", "/stop")
        await f.settle(240)
        replies = [e.text for e in f.events if getattr(e, "kind", "") == "command"]
        f.send("s1", "and now?")
        await f.settle(240)
    assert replies and replies[0].startswith("Stopped")
    assert "turn_end" in f.kinds("s1")
    status = raw_count(pg_url, "SELECT status FROM turns ORDER BY id LIMIT 1")
    assert status == "interrupted"
    kept = raw_count(pg_url, "SELECT COUNT(*) FROM messages WHERE parts LIKE ?", ("%ran.txt%",))
    assert kept == 1  # the tool call, with its result kept in the record
    assert (
        raw_count(pg_url, "SELECT COUNT(*) FROM messages WHERE parts LIKE ?", ("%tool_result%",))
        == 1
    )
    wf = raw_count(
        pg_url.split("?")[0],
        "SELECT COUNT(*) FROM "
        + _dbos_schema(pg_url)
        + ".workflow_status WHERE status = 'CANCELLED'",
    )
    assert wf == 1
    assert raw_count(pg_url, "SELECT status FROM turns ORDER BY id DESC LIMIT 1") == "done"


def _waits_for_go(body: dict[str, Any]) -> ServerReply:
    """First call: a bash tool that waits for the file `go` in the workspace; then an answer
    naming every user text after the tool's result (the mail the run drained with it)."""
    roles = [m["role"] for m in body["messages"]]
    if "tool" not in roles:
        wait = "while [ ! -f go ]; do sleep 0.05; done; echo ran"
        return ServerReply(tool_calls=[("bash", {"command": wait})])
    after = body["messages"][roles.index("tool") :]
    said = [m["content"] for m in after if m["role"] == "user" and isinstance(m["content"], str)]
    return ServerReply(text="answered: " + " | ".join(said))


async def test_a_follow_up_mid_turn_is_answered_in_the_same_turn_on_another_process(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in one process (tests/test_engine_loop.py): a message typed while a worker's turn
    runs a tool reaches that turn's mailbox and is answered with the tool's result, in the
    same turn; its own workflow then finds it stored and runs no second turn."""
    async with on_workers(_waits_for_go, heron_home, pg_url, monkeypatch, n=1) as (server, _, f):
        f.send("f1", "start the job")
        await f.wait_for(lambda: "tool_start" in f.kinds("f1"))
        f.send("f1", "also, make it blue")
        await f.wait_for(lambda: "mail" in f.kinds("f1"))
        (heron_home / "workspace" / "go").touch()
        await f.settle(240)
    assert "queued" not in f.kinds("f1")
    assert f.texts("answer") == ["answered: " + MAIL_LABEL + "also, make it blue"]
    assert len(server.requests) == 2
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns") == 1
    assert raw_count(pg_url, "SELECT status FROM turns") == "done"
    stored = "SELECT COUNT(*) FROM messages WHERE role = 'user' AND parts LIKE ?"
    assert raw_count(pg_url, stored, ("%blue%",)) == 1  # once, with the tool's result
    held = "SELECT COUNT(*) FROM messages WHERE parts LIKE ? AND meta LIKE ?"
    assert raw_count(pg_url, held, ("%tool_result%blue%", f"%{MAIL_META}%")) == 1
    assert _dbos_count(pg_url, "status = 'SUCCESS'") == 2  # the turn, and the mail's own


def _asks_the_city(body: dict[str, Any]) -> ServerReply:
    """ask_user first; once its result is in, an answer naming it."""
    tool = [m for m in body["messages"] if m["role"] == "tool"]
    if not tool:
        return ServerReply(tool_calls=[("ask_user", {"question": "Which city?", "minutes": 5})])
    return ServerReply(text="noted: " + str(tool[-1]["content"]))


async def test_ask_user_in_a_worker_turn_is_answered_by_the_next_message(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's turn waits on ask_user; the question reaches the face's clients, and the
    next message typed there is the answer: the run resumes from the call with it, and the
    message's own workflow runs no second turn (the question's row names it)."""
    async with on_workers(_asks_the_city, heron_home, pg_url, monkeypatch, n=1) as (server, _, f):
        f.send("a1", "plan the trip")
        await f.wait_for(lambda: any("Which city?" in t for t in f.texts("question")))
        f.send("a1", "Lisbon")
        await f.settle(240)
    assert f.texts("answer") == ["noted: The user answered: Lisbon"]
    assert "queued" not in f.kinds("a1")
    assert len(server.requests) == 2  # the question, then the answer: no turn for "Lisbon"
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns") == 1
    asked = "SELECT status || ':' || result FROM runs WHERE kind = 'ask'"
    assert raw_count(pg_url, asked) == "answered:Lisbon"
    assert raw_count(pg_url, "SELECT COUNT(*) FROM runs WHERE answered_by IS NOT NULL") == 1
    assert _dbos_count(pg_url, "status = 'SUCCESS'") == 2  # the turn, and the answer's own


def _works_on_the_goal(body: dict[str, Any]) -> ServerReply:
    """A nudge: marks the goal done with evidence; after the tool's result, says so."""
    if any(m["role"] == "tool" for m in body["messages"]):
        return ServerReply(text="counted")
    return ServerReply(tool_calls=[("goal", {"action": "done", "evidence": "12 files"})])


async def test_a_goal_set_on_the_face_is_nudged_through_the_queue(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/goal typed at the face runs on a worker; its turn's end enqueues the goal's nudge as a
    workflow of the same conversation, which a worker runs (no model deadline, the goal in the
    runtime block) until the agent marks the goal done: then no further nudge."""
    async with on_workers(_works_on_the_goal, heron_home, pg_url, monkeypatch, n=1) as (
        server,
        _,
        f,
    ):
        f.send("g1", "/goal Count the files")
        done = "SELECT COUNT(*) FROM goals WHERE status = 'done'"
        await f.wait_for(lambda: raw_count(pg_url, done) == 1)
        await f.wait_for(lambda: _dbos_count(pg_url, "status = 'SUCCESS'") == 2)
    assert f.texts("command")[0].startswith("Goal set")
    starts = [e for e in f.events if isinstance(e, TurnEvent) and e.kind == "turn_start"]
    assert [e.provenance for e in starts] == ["user", "goal"]  # the nudge streams to the face
    assert len(server.requests) == 2  # the nudge's turn: the goal tool, then its answer
    nudge = server.requests[0]["messages"]
    assert _last_user_text(server.requests[0]).startswith("[Heron: your goal continues]")
    assert any("Count the files" in str(m["content"]) for m in nudge)  # the runtime block
    assert raw_count(pg_url, "SELECT evidence FROM goals") == "12 files"
    assert _dbos_count(pg_url, "status <> 'SUCCESS'") == 0  # no third workflow, none failed


def _spawns(wait: bool) -> Script:
    """The origin spawns a subagent (its task: count to three), which counts; the origin
    answers the tool's result, then the announcement of the result when it comes."""

    def script(body: dict[str, Any]) -> ServerReply:
        last = _last_user_text(body)
        if last.startswith("count to three"):
            return ServerReply(text="one two three")
        if last.startswith("[Subagent result"):
            return ServerReply(text="got the result")
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if results:
            return ServerReply(text="spawned: " + str(results[-1])[:200])
        task = {"task": "count to three", "wait": wait}
        return ServerReply(tool_calls=[("spawn", task)])

    return script


@pytest.mark.parametrize("wait", [False, True])
async def test_a_subagent_spawned_on_a_worker_runs_as_a_workflow_of_its_own(
    wait: bool, pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spawn in a worker's turn: the subagent's task is a workflow of `subagent:<lineage>`,
    run by a worker, its result recorded on the run's row; then either announced into the
    origin by a workflow of its own (one turn there answers it) or, with wait=True, returned
    as the spawn call's result and not announced."""
    done = "SELECT COUNT(*) FROM runs WHERE kind = 'subagent' AND announced IS NOT NULL"
    async with on_workers(_spawns(wait), heron_home, pg_url, monkeypatch) as (server, _, f):
        f.send("o1", "hand it off")
        await f.wait_for(lambda: raw_count(pg_url, done) == 1)
        await f.wait_for(lambda: _dbos_count(pg_url, "status = 'SUCCESS'") == 3 - wait)
        # The last turn's notes reach the face after its workflow's end is in the database.
        await f.wait_for(lambda: len(f.texts("answer", "o1")) == 2 - wait)
    assert raw_count(pg_url, "SELECT status || ':' || result FROM runs") == "done:one two three"
    assert _dbos_count(pg_url, "queue_partition_key LIKE 'subagent:%%'") == 1
    answers = f.texts("answer", "o1")
    if wait:
        assert len(answers) == 1 and "one two three" in answers[0]
        assert len(server.requests) == 3  # origin, subagent, origin with the result
    else:
        assert answers[0].startswith("spawned: Started subagent")
        assert answers[1:] == ["got the result"]
        held = "SELECT COUNT(*) FROM messages WHERE parts LIKE ? AND meta LIKE ?"
        assert raw_count(pg_url, held, ("%Subagent result%one two three%", "%run%")) == 1
    assert _dbos_count(pg_url, "status <> 'SUCCESS'") == 0


RETRY_SAYS = "[Heron: the turn that received subagent"


def _announce_fails(retry_fails: bool) -> Script:
    """As `_spawns`, but the model refuses the announcement's turn (a 400: the turn fails on
    a model error), and its retry's too when `retry_fails`; a later message is answered."""
    refused = ServerReply(status=400, error_body={"error": {"message": "refused for now"}})

    def script(body: dict[str, Any]) -> ServerReply:
        last = _last_user_text(body)
        if last.startswith("count to three"):
            return ServerReply(text="one two three")
        if last.startswith("[Subagent result"):
            return refused
        if last.startswith(RETRY_SAYS):
            return refused if retry_fails else ServerReply(text="got the result, late")
        if last.startswith("and the count?"):
            return ServerReply(text="it counted to three")
        if any(m["role"] == "tool" for m in body["messages"]):
            return ServerReply(text="spawned")
        return ServerReply(tool_calls=[("spawn", {"task": "count to three"})])

    return script


async def _until(predicate: Callable[[], bool], timeout: float = 240.0) -> None:
    """Until `predicate()` (errors expected: the refused turns say theirs to the face)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("retry_fails", [False, True])
async def test_an_announcement_that_fails_on_a_worker_is_retried_once_and_kept_owed(
    retry_fails: bool, pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The announcement's turn fails on a model error: the result stays unanswered, so the
    run is not marked announced; one retry turn answers it (marked then). When the retry
    fails too, no third turn: the run stays owed until a turn there ends well."""
    announced = "SELECT COUNT(*) FROM runs WHERE kind = 'subagent' AND announced IS NOT NULL"
    unsettled = "status NOT IN ('SUCCESS', 'ERROR')"
    script = _announce_fails(retry_fails)
    async with on_workers(script, heron_home, pg_url, monkeypatch) as (server, _, f):

        def retries() -> int:
            return sum(_last_user_text(b).startswith(RETRY_SAYS) for b in server.requests)

        f.send("o3", "hand it off")
        await _until(lambda: retries() == 1)
        await _until(lambda: _dbos_count(pg_url, unsettled) == 0)
        if not retry_fails:
            await _until(lambda: raw_count(pg_url, announced) == 1)
            await _until(lambda: "got the result, late" in f.texts("answer", "o3"))
        else:
            await asyncio.sleep(1.0)  # time for a wrong third turn or mark to show
            assert raw_count(pg_url, announced) == 0  # owed: nothing answered it
            f.send("o3", "and the count?")
            await _until(lambda: raw_count(pg_url, announced) == 1)
            # the mark commits before the answer's note reaches the face: wait for it, as above
            await _until(lambda: "it counted to three" in f.texts("answer", "o3"))
            assert f.texts("answer", "o3")[-1] == "it counted to three"
        assert retries() == 1  # one retry, never a second
    announcements = [b for b in server.requests if "[Subagent result" in _last_user_text(b)]
    assert len(announcements) == 1


async def test_starting_faces_continue_a_goal_left_open_once(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A goal left active with no turn working on it (its chat closed) goes on when a serve
    with workers starts: a worker runs its nudge until the agent marks the goal done, and a
    second face starting meanwhile finds the conversation busy (or the goal done) and
    enqueues nothing more. (Faces that check in the same instant enqueue the nudge under one
    workflow id, which DBOS runs once; that race is not forced here.)"""
    from heron.store import Store, goals

    goals.set_goal(Store(pg_url), "left", "Count the files")
    done = "SELECT COUNT(*) FROM goals WHERE status = 'done'"
    script = _works_on_the_goal
    async with (
        on_workers(script, heron_home, pg_url, monkeypatch, n=1) as (server, _, _f),
        face(pg_url, monkeypatch, resume_goals=True) as f1,
        face(pg_url, monkeypatch, resume_goals=True),
    ):
        await f1.wait_for(lambda: raw_count(pg_url, done) == 1)
        await f1.wait_for(lambda: _dbos_count(pg_url, "status = 'SUCCESS'") == 1)
    assert len(server.requests) == 2  # one nudge: the goal tool, then its answer
    assert _last_user_text(server.requests[0]).startswith("[Heron: your goal continues]")
    assert _dbos_count(pg_url, "status <> 'SUCCESS'") == 0


async def test_idle_workers_poll_slower_and_the_next_message_speeds_them_up(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The face's governor sets the queue's polling interval, which the workers read at each
    poll: slow once the face is idle, fast again before the next message is queued, which
    the workers then answer."""
    interval = (
        f"SELECT polling_interval_sec FROM {_dbos_schema(pg_url)}.queues WHERE name = 'heron_turns'"
    )
    raw = pg_url.split("?")[0]
    async with on_workers(echo, heron_home, pg_url, monkeypatch, n=1, governed=True) as (_, _, f):
        assert f.governor is not None
        f.governor.idle_after_s = 0.0
        await f.wait_for(lambda: raw_count(raw, interval) == f.governor.slow_s)
        f.governor.idle_after_s = 3600.0  # from here on, no slowing down again
        f.send("p1", "hello")
        await f.wait_for(lambda: bool(f.texts("answer")))
        assert raw_count(raw, interval) == f.governor.fast_s
    assert f.texts("answer") == ["answer to hello"]


def _spawns_slow_work() -> tuple[Script, threading.Event]:
    """The origin spawns a subagent whose task runs a tool, then answers slowly the first
    time (a worker to kill mid-turn: the event is set then); the origin answers the
    announcement."""
    held = threading.Event()

    def script(body: dict[str, Any]) -> ServerReply:
        last = _last_user_text(body)
        tool = [m for m in body["messages"] if m["role"] == "tool"]
        if last.startswith("[Subagent result"):
            return ServerReply(text="got it")
        if last.startswith("work on sub"):
            if not tool:
                return ServerReply(tool_calls=[("bash", {"command": "echo ran >> ran.txt"})])
            first = not held.is_set()
            held.set()
            return ServerReply(text="finished sub", delay_s=60.0 if first else 0.0)
        if tool:
            return ServerReply(text="spawned")
        return ServerReply(tool_calls=[("spawn", {"task": "work on sub"})])

    return script, held


async def test_a_worker_killed_mid_subagent_turn_is_finished_and_announced_by_another(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker running a subagent's turn is killed after its tool ran: another worker
    continues the turn from the record (the tool not run again), records the run's result
    and announces it into the origin once."""
    pending = (
        f"SELECT executor_id FROM {_dbos_schema(pg_url)}.workflow_status"
        " WHERE status = 'PENDING' AND queue_partition_key LIKE 'subagent:%%'"
    )
    announced = "SELECT COUNT(*) FROM runs WHERE announced IS NOT NULL"
    script, held = _spawns_slow_work()
    async with on_workers(script, heron_home, pg_url, monkeypatch) as (_, workers, f):
        f.send("o2", "hand it off")
        await f.wait_for(lambda: f.texts("answer", "o2") == ["spawned"])
        await f.wait_for(held.is_set)
        owner = raw_count(pg_url.split("?")[0], pending)
        workers.kill(int(str(owner).split("-")[-2]))
        await f.wait_for(lambda: raw_count(pg_url, announced) == 1)
        await f.wait_for(lambda: f.texts("answer", "o2") == ["spawned", "got it"])
    ran = (heron_home / "workspace" / "ran.txt").read_text().splitlines()
    assert ran == ["ran"], "the subagent's finished tool call ran again"
    assert raw_count(pg_url, "SELECT status || ':' || result FROM runs") == "done:finished sub"
    held = "SELECT COUNT(*) FROM messages WHERE parts LIKE ? AND meta LIKE ?"
    assert raw_count(pg_url, held, ("%Subagent result%finished sub%", "%run%")) == 1


def _runs_a_command(body: dict[str, Any]) -> ServerReply:
    tool = [m for m in body["messages"] if m["role"] == "tool"]
    if not tool:
        return ServerReply(tool_calls=[("bash", {"command": "echo approved-run"})])
    return ServerReply(text="result: " + str(tool[-1]["content"])[:300])


@pytest.mark.parametrize("allow", [True, False])
async def test_a_command_in_a_worker_turn_is_asked_of_the_face_clients(
    allow: bool, pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unconfined (no bubblewrap: approval "ask"), a worker's command waits for the person:
    its `approval` event reaches the face's clients as a note, a client's answer goes back to
    the workers, and the one waiting runs the command or declines it."""
    from heron.bus import TurnEvent
    from heron.tools.approval import DECLINED

    monkeypatch.setenv("HERON_BWRAP", "off")  # the workers inherit it (worker_env)
    async with on_workers(_runs_a_command, heron_home, pg_url, monkeypatch, n=1) as (_, _, f):
        f.send("a2", "run it")

        def asked() -> list[TurnEvent]:
            return [e for e in f.events if isinstance(e, TurnEvent) and e.kind == "approval"]

        await f.wait_for(lambda: bool(asked()))
        approval = asked()[0].approval
        assert approval is not None and approval.command == "echo approved-run"
        assert await f.loop.answer_elsewhere("a2", approval.id, allow, "tab-1")
        await f.settle(240)
    ends = [e.approval for e in f.events if isinstance(e, TurnEvent) and e.kind == "approval_end"]
    assert [(a.allowed, a.by, a.reason) for a in ends if a] == [(allow, "tab-1", "answered")]
    (answer,) = f.texts("answer", "a2")
    assert ("approved-run" in answer) is allow
    assert (DECLINED[:30] in answer) is not allow


async def test_a_job_due_once_fires_once_with_two_faces_and_two_workers(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every `heron serve --workers` face runs a scheduler. Two faces' schedulers, each on a
    connection and a thread of its own (as in two processes), claim the same due jobs at the
    same instant; each job fires once (its run recorded once, by the scheduler that fired
    it) and its turn runs once, on one of the 2 workers."""
    import asyncio
    import threading

    from heron.bus import MessageBus
    from heron.proactive.clock import FakeClock
    from heron.proactive.scheduler import Scheduler
    from heron.store import Store
    from heron.store import jobs as js
    from heron.store.schedule import parse

    jobs = 20
    made_at = dt.datetime(2026, 6, 1, 8, 0, tzinfo=dt.UTC).timestamp()
    when = parse(at="2026-06-01 09:00", timezone="UTC")
    clock = FakeClock(made_at + 3601)  # one second after the instant
    stores = [Store(pg_url), Store(pg_url)]
    for i in range(jobs):
        js.create_job(stores[0], when, conversation=f"chat-{i}", prompt=f"job {i}",
                      now=made_at, created_by="test")  # fmt: skip
    schedulers = [Scheduler(store, MessageBus(), clock) for store in stores]
    together = threading.Barrier(2, timeout=60)

    def tick(scheduler: Scheduler) -> int:
        together.wait()
        return asyncio.run(scheduler.tick())

    with model_server(echo) as (server, url):
        workers = Workers(worker_env(heron_home, pg_url, url))
        try:
            workers.start(2)
            async with face(pg_url, monkeypatch) as f1, face(pg_url, monkeypatch) as f2:
                fired = await asyncio.gather(*(asyncio.to_thread(tick, s) for s in schedulers))
                for scheduler, f in zip(schedulers, (f1, f2), strict=True):
                    scheduler.watch(f.loop)  # the face records its scheduler's runs
                    while not scheduler.bus.inbound.empty():  # what it fired, to its face
                        await f.loop.dispatch(scheduler.bus.inbound.get_nowait())
                await f1.settle()
                await f2.settle()
                for f in (f1, f2):  # a face settles on its own jobs; the other's notes may lag
                    await f.wait_for(lambda f=f: len(f.texts("answer")) >= jobs)
                again = await asyncio.gather(*(asyncio.to_thread(tick, s) for s in schedulers))
        finally:
            workers.stop()
            for store in stores:
                store.close()
    assert sum(fired) == jobs and sum(again) == 0
    assert raw_count(pg_url, "SELECT COUNT(*) FROM job_runs") == jobs
    assert raw_count(pg_url, "SELECT COUNT(*) FROM job_runs WHERE status = 'done'") == jobs
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns WHERE status = 'done'") == jobs
    assert raw_count(pg_url, "SELECT COUNT(DISTINCT conversation_id) FROM turns") == jobs
    assert len(server.requests) == jobs
    for f in (f1, f2):  # each face's clients see every conversation's answers, once
        answers = f.texts("answer")
        assert len(answers) == jobs and all("Scheduled reminder" in a for a in answers)


async def test_heron_serve_with_workers_answers_through_them_and_stops_cleanly(
    pg_url: str, heron_home: Path
) -> None:
    """The command itself: `heron serve --workers 2` starts its workers, takes a message on
    its control socket, has a worker answer it, and on SIGTERM stops them and exits 0."""
    import asyncio
    import signal
    import subprocess
    import sys

    from serve_helpers import LineClient

    from heron.serve.lock import SOCKET_NAME

    offered: list[set[str]] = []

    def model(body: dict[str, Any]) -> ServerReply:
        offered.append({t["function"]["name"] for t in body.get("tools") or []})
        return echo(body)

    with model_server(model) as (_, url):
        proc = subprocess.Popen(
            [sys.executable, "-m", "heron", "serve", "--port", "0", "--workers", "2"],
            env=worker_env(heron_home, pg_url, url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            first = await asyncio.to_thread(proc.stdout.readline)
            assert first.startswith("heron serve: http://127.0.0.1:"), first
            client = await LineClient.open(heron_home / SOCKET_NAME)
            await client.send({"type": "hello", "conversation": "w1", "last_seq": None})
            await client.send({"type": "send", "text": "hello workers"})
            events = await asyncio.wait_for(client.until("turn_end"), 240)
            await client.close()
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(proc.communicate, timeout=120)
            code = proc.returncode
        finally:
            if proc.poll() is None:
                proc.kill()
    assert code == 0, err[-2000:]
    assert "Traceback" not in err, err[-2000:]  # the face's and the workers' stderr
    assert any("answer to hello workers" in str(e) for e in events), events
    # A worker's turn has the proactive tools as a serve's own turn does.
    assert offered and {"run_cell", "spawn", "ask_user", "goal"} <= offered[0]
    assert _dbos_count(pg_url, "status = 'SUCCESS'") == 1  # the turn ran as a workflow
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns WHERE status = 'done'") == 1


def test_a_worker_on_sqlite_says_it_needs_postgresql(heron_home: Path) -> None:
    import subprocess
    import sys

    env = worker_env(heron_home, "", "http://127.0.0.1:9/v1")
    del env["HERON_DATABASE_URL"]
    done = subprocess.run(
        [sys.executable, "-m", "heron", "worker"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "workers need PostgreSQL" in done.stderr


def _tool_then_done(body: dict[str, Any]) -> ServerReply:
    """A turn of two calls, each a little slow (a kill lands mid-turn): a bash call that notes
    the message in ran.txt, then the answer."""
    roles = [m["role"] for m in body["messages"]]
    last_user = len(roles) - 1 - roles[::-1].index("user")
    said = _last_user_text(body).splitlines()[0]
    if "tool" not in roles[last_user:] and said.startswith("work"):
        note = said.removeprefix("work ")
        return ServerReply(tool_calls=[("bash", {"command": f"echo {note} >> ran.txt"})],
                           delay_s=0.15)  # fmt: skip
    return ServerReply(text="done", delay_s=0.15)


async def test_workers_killed_at_random_instants_lose_nothing(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kill -9 of a worker at random instants while 10 conversations run 2 turns each (a tool
    call and an answer), a fresh worker started after each kill: every message is stored
    once and answered, every conversation's record is well-formed (no orphaned call), and no
    finished tool call ran twice."""
    import asyncio
    import random

    from heron.context.repair import is_well_formed
    from heron.store import Store

    rng = random.Random(18)
    conversations, turns, kills = 10, 2, 3
    async with on_workers(_tool_then_done, heron_home, pg_url, monkeypatch) as (_, workers, f):
        for t in range(turns):
            for c in range(conversations):  # reminders: each message a turn of its own
                f.send(f"k{c}", f"work k{c} t{t}", provenance="reminder")
        for _ in range(kills):
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            busy = _owners_in_flight(pg_url)  # the worker of a turn in flight, if any
            alive = [p.pid for p in workers.procs if p.poll() is None]
            workers.kill(rng.choice([p for p in alive if p in busy] or alive))
            await asyncio.to_thread(workers.start, 1)
        await f.settle(400)
    ran = (heron_home / "workspace" / "ran.txt").read_text().splitlines()
    assert len(ran) == len(set(ran)), "a finished tool call ran again"
    monkeypatch.setenv("HERON_DATABASE_URL", pg_url)
    store = Store(pg_url)
    try:
        for c in range(conversations):
            conversation = store.conversation(f"k{c}")
            assert conversation is not None
            branch = store.branch(conversation.id)
            said = [r.message.text for r in branch if r.role == "user"]
            for t in range(turns):
                assert said.count(f"work k{c} t{t}") == 1, said  # stored once, never lost
            assert is_well_formed([r.wire for r in branch])
            answers = [r.message.text for r in branch if r.role == "assistant"]
            assert answers.count("done") == turns, answers  # each message answered once
    finally:
        store.close()
    assert raw_count(pg_url, "SELECT COUNT(*) FROM turns WHERE status = 'running'") == 0
    redone = _dbos_count(pg_url, "recovery_attempts > 1")  # dispatched again after a kill
    assert isinstance(redone, int) and redone >= 1


def _owners_in_flight(pg_url: str) -> set[int]:
    """The pids of the workers running a turn now (DBOS's executor ids name them)."""
    import psycopg

    from heron.scale import records

    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
        owners = records.owners_in_flight(conn, _dbos_schema(pg_url), "heron_turns")
    return {int(o.split("-")[-2]) for o in owners}


ALERT = "MONITOR ALERT: the build is red"
# Rows of `personal` that hold background work's message (their meta names where it was said).
RELAYED = (
    "SELECT COUNT(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id"
    " WHERE c.key = 'personal' AND m.meta LIKE '%%spoken_in%%'"
)


class _MonitorAndTurn:
    """`personal`'s turn waits in a bash tool for the file `go`; a monitor's turn says ALERT
    with `message` (recording what the tool answered), then ends."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def __call__(self, body: dict[str, Any]) -> ServerReply:
        messages = body["messages"]
        if "[Scheduled check, job" not in json.dumps(messages):
            return _waits_for_go(body)
        if messages[-1]["role"] == "tool":
            self.told.append(str(messages[-1]["content"]))
            return ServerReply(text="Told them.")
        return ServerReply(tool_calls=[("message", {"text": ALERT})])


async def _monitor_speaks_during_a_turn(pg_url: str, f: Any, model: _MonitorAndTurn) -> int:
    """A turn of `personal` running its tool on a worker, then a monitor job made in `personal`
    fired (its turn on a worker) until its `message` tool answered; returns the job's id."""
    from heron.bus import MessageBus
    from heron.proactive.clock import FakeClock
    from heron.proactive.scheduler import Scheduler
    from heron.store import Store
    from heron.store import jobs as js
    from heron.store.schedule import parse

    f.send("personal", "start the job")
    await f.wait_for(lambda: "tool_start" in f.kinds("personal"))
    made_at = dt.datetime(2026, 6, 1, 8, 0, tzinfo=dt.UTC).timestamp()
    store = Store(pg_url)
    try:
        when = parse(at="2026-06-01 09:00", timezone="UTC")
        job = js.create_job(store, when, conversation="personal", prompt="Is CI green?",
                            now=made_at, mode="monitor", created_by="test")  # fmt: skip
        scheduler = Scheduler(store, MessageBus(), FakeClock(made_at + 3601))
        scheduler.watch(f.loop)
        assert await scheduler.tick() == 1
        await f.loop.dispatch(scheduler.bus.inbound.get_nowait())  # to its face
        await f.wait_for(lambda: bool(model.told))
    finally:
        store.close()
    return job.id


def _personal_rows(pg_url: str) -> list[tuple[Any, ...]]:
    """(role, author, parts, sent_parts, meta) of `personal`'s rows, in order."""
    import psycopg

    rows = "SELECT m.role, m.author, m.parts, m.sent_parts, m.meta FROM messages m"
    rows += " JOIN conversations c ON c.id = m.conversation_id"
    rows += " WHERE c.key = 'personal' ORDER BY m.id"
    with psycopg.connect(pg_url) as conn:
        return conn.execute(rows).fetchall()


def _is_the_alert(row: tuple[Any, ...], job: int) -> bool:
    label = f"[Sent to the user by scheduled job {job} (a monitor), not written by the user] "
    role, author, parts, sent, meta = row
    return (
        (role, author) == ("user", "heron")
        and ALERT in parts
        and label + ALERT in sent
        and (f"cron:{job}" in meta)
    )


async def test_a_monitors_message_to_a_conversation_whose_turn_runs_on_a_worker_is_kept_after_it(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A monitor job (its turn on a worker) speaks to `personal` while a turn runs there on a
    worker: the face's clients see it at once; it waits on disk, not inside that turn, and is
    stored in `personal` once, after the turn's rows, labelled as Heron's."""
    model = _MonitorAndTurn()
    async with on_workers(model, heron_home, pg_url, monkeypatch) as (_, _, f):
        job = await _monitor_speaks_during_a_turn(pg_url, f, model)
        await f.wait_for(lambda: f.texts("message", "personal") == [ALERT])  # live, at once
        assert raw_count(pg_url, RELAYED) == 0  # waiting: not inside the running turn
        assert raw_count(pg_url, "SELECT COUNT(*) FROM waiting_messages") == 1
        (heron_home / "workspace" / "go").touch()
        await f.settle()
        await f.wait_for(lambda: raw_count(pg_url, RELAYED) == 1, timeout=60)
        await f.settle()
    # Held by the worker running `personal`'s turn, or taken by another one: kept either way.
    kept = "Sent to the user and kept in conversation 'personal'"
    assert model.told in ([kept + " once the turn running there ends."], [kept + "."])
    assert raw_count(pg_url, RELAYED) == 1  # once
    assert raw_count(pg_url, "SELECT COUNT(*) FROM waiting_messages") == 0
    *turn, last = _personal_rows(pg_url)
    assert turn[-1][0] == "assistant" and _is_the_alert(last, job)  # the turn's answer, then it


async def test_a_monitors_message_waiting_for_a_killed_workers_turn_is_kept_after_its_end(
    pg_url: str, heron_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, and then the worker running `personal`'s turn is killed (-9) while the message
    waits: the message is not lost with it, and does not close that turn either (another
    worker continues it from the record); it is stored once, after the continued turn's end."""
    model = _MonitorAndTurn()
    pending = "SELECT executor_id FROM " + _dbos_schema(pg_url) + ".workflow_status"
    pending += " WHERE status = 'PENDING'"
    dbos = pg_url.split("?")[0]
    async with on_workers(model, heron_home, pg_url, monkeypatch) as (_, workers, f):
        job = await _monitor_speaks_during_a_turn(pg_url, f, model)
        count = pending.replace("executor_id", "COUNT(*)")
        await f.wait_for(lambda: raw_count(dbos, count) == 1)  # personal's, the monitor's ended
        workers.kill(int(str(raw_count(dbos, pending)).split("-")[-2]))
        await f.wait_for(lambda: f.texts("answer", "personal") != [])  # continued, answered
        await f.settle()
        await f.wait_for(lambda: raw_count(pg_url, RELAYED) == 1, 60)
    assert raw_count(pg_url, RELAYED) == 1  # once
    assert raw_count(pg_url, "SELECT COUNT(*) FROM waiting_messages") == 0
    turns = "SELECT string_agg(t.status || ':' || COALESCE(t.stop_reason, ''), ',' ORDER BY t.id)"
    turns += " FROM turns t JOIN conversations c ON c.id = t.conversation_id"
    turns += " WHERE c.key = 'personal'"
    assert raw_count(pg_url, turns) == "interrupted:recovered,done:done"  # not closed by it
    *turn, last = _personal_rows(pg_url)
    assert (turn[-1][0], turn[-1][1]) == ("assistant", "model") and _is_the_alert(last, job)
