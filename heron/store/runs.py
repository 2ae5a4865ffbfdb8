"""Store functions of runs that outlive a turn: subagents and questions that wait (table `runs`,
migration m009).

A run's row is written before its work starts, so a restart finds it: one still `running` (or
`waiting`) whose process is gone is marked `interrupted`. A subagent's result is announced
exactly once: the message that carries it into the origin conversation names the run in its
meta (`subagent_run`), and that row, not the `announced` column, is what decides.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from heron import timefmt
from heron.store.db import Store
from heron.store.engine_state import bump_epoch, pid_alive

# Statuses of a subagent that has finished, one way or another: its result is owed to the origin.
ENDED = ("done", "failed", "timed_out", "interrupted")
RUN_META = "subagent_run"  # meta flag of the origin's message that carries a run's result


@dataclass(frozen=True)
class Run:
    id: str
    kind: str  # subagent | ask
    origin_key: str
    origin_channel: str
    origin_chat: str
    origin_internal: bool
    lineage: str | None
    task: str
    tools: list[str] | None
    status: str
    result: str | None
    partial: bool
    announced: float | None
    deadline: float | None
    pid: int | None
    created: float
    finished: float | None
    call_id: str | None = None  # a question's: the `ask_user` call that asked it

    @property
    def conversation_key(self) -> str | None:
        return f"subagent:{self.lineage}" if self.lineage else None


def _run(r: object) -> Run:
    tools = r["tools"]  # type: ignore[index]
    return Run(
        r["id"],  # type: ignore[index]
        r["kind"],  # type: ignore[index]
        r["origin_key"],  # type: ignore[index]
        r["origin_channel"],  # type: ignore[index]
        r["origin_chat"],  # type: ignore[index]
        bool(r["origin_internal"]),  # type: ignore[index]
        r["lineage"],  # type: ignore[index]
        r["task"],  # type: ignore[index]
        json.loads(tools) if tools else None,
        r["status"],  # type: ignore[index]
        r["result"],  # type: ignore[index]
        bool(r["partial"]),  # type: ignore[index]
        r["announced"],  # type: ignore[index]
        r["deadline"],  # type: ignore[index]
        r["pid"],  # type: ignore[index]
        r["created"],  # type: ignore[index]
        r["finished"],  # type: ignore[index]
        r["call_id"],  # type: ignore[index]
    )


def create(
    store: Store,
    run_id: str,
    kind: str,
    origin_key: str,
    task: str,
    *,
    status: str,
    lineage: str | None = None,
    tools: list[str] | None = None,
    origin_channel: str = "subagent",
    origin_chat: str = "",
    origin_internal: bool = False,
    deadline: float | None = None,
    call_id: str | None = None,
) -> Run:
    with store.transaction() as c:
        c.execute(
            "INSERT INTO runs (id, kind, origin_key, origin_channel, origin_chat, origin_internal,"
            " lineage, task, tools, status, deadline, pid, created, call_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                kind,
                origin_key,
                origin_channel,
                origin_chat,
                int(origin_internal),
                lineage,
                task,
                json.dumps(tools) if tools is not None else None,
                status,
                deadline,
                os.getpid(),
                time.time(),
                call_id,
            ),
        )
    found = get(store, run_id)
    assert found is not None
    return found


def start(store: Store, run_id: str) -> bool:
    """A subagent that waited for a slot starts now: running, its clock (`created`) from now.
    False when it no longer waits (cancelled while it waited): it must not run."""
    with store.transaction() as c:
        cur = c.execute(
            "UPDATE runs SET status = 'running', created = ? WHERE id = ? AND status = 'waiting'",
            (time.time(), run_id),
        )
    return cur.rowcount == 1


def place(store: Store, run: Run) -> int:
    """A subagent waiting for a slot: its place in line (1: next to start) among those its
    process holds back."""
    rows = store.query(
        "SELECT COUNT(*) FROM runs WHERE kind = 'subagent' AND status = 'waiting' AND pid = ?"
        " AND (created < ? OR (created = ? AND id <= ?))",
        (run.pid, run.created, run.created, run.id),
    )
    return max(1, int(rows[0][0]))


def waiting_for_slot(store: Store, run: Run) -> str:
    """How a subagent that has not started yet is shown (/status, `heron runs list`, the
    browser's Work panel): waiting, with its place in line, and no clock."""
    return f"waiting for a slot ({ordinal(place(store, run))} in line)"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def restart(store: Store, run_id: str, status: str = "running") -> None:
    """A resumed lineage runs again under its row: owed nothing until it ends."""
    with store.transaction() as c:
        c.execute(
            "UPDATE runs SET status = ?, result = NULL, partial = 0, announced = NULL,"
            " finished = NULL, pid = ? WHERE id = ?",
            (status, os.getpid(), run_id),
        )


def set_task(store: Store, run_id: str, task: str) -> None:
    with store.transaction() as c:
        c.execute("UPDATE runs SET task = ? WHERE id = ?", (task, run_id))


def record_result(store: Store, run_id: str, result: str, partial: bool) -> None:
    """The result of a run that ended without one (interrupted): what its transcript held."""
    with store.transaction() as c:
        c.execute(
            "UPDATE runs SET result = ?, partial = ? WHERE id = ?", (result, int(partial), run_id)
        )


def get(store: Store, run_id: str) -> Run | None:
    rows = store.query("SELECT * FROM runs WHERE id = ?", (run_id,))
    return _run(rows[0]) if rows else None


def by_lineage(store: Store, lineage: str) -> Run | None:
    rows = store.query(
        "SELECT * FROM runs WHERE lineage = ? ORDER BY created DESC LIMIT 1", (lineage,)
    )
    return _run(rows[0]) if rows else None


def listing(store: Store, *, limit: int = 50, origin_key: str | None = None) -> list[Run]:
    if origin_key is None:
        rows = store.query("SELECT * FROM runs ORDER BY created DESC LIMIT ?", (limit,))
    else:
        rows = store.query(
            "SELECT * FROM runs WHERE origin_key = ? ORDER BY created DESC LIMIT ?",
            (origin_key, limit),
        )
    return [_run(r) for r in rows]


def finish(
    store: Store,
    run_id: str,
    status: str,
    result: str | None,
    *,
    partial: bool = False,
    answered_by: str | None = None,
) -> bool:
    """End a run that is still open (running or waiting); False when it had already ended (a
    cancel got there first). `answered_by`: the queued message that answered a question."""
    with store.transaction() as c:
        cur = c.execute(
            "UPDATE runs SET status = ?, result = ?, partial = ?, finished = ?, answered_by = ?"
            " WHERE id = ? AND status IN ('running', 'waiting')",
            (status, result, int(partial), time.time(), answered_by, run_id),
        )
    return cur.rowcount == 1


@dataclass(frozen=True)
class Questions:
    """The questions `ask_user` asked in one conversation (oldest first), found by the call
    that asked each: a transcript shows the question and the answer where the call is."""

    asked: list[Run]

    def of(self, call_id: str, after: float) -> Run | None:
        """The question asked by call `call_id` of a reply stored at `after` (epoch seconds).
        Call ids repeat across replies ("c1"): the first question asked since that reply."""
        for run in self.asked:
            if run.call_id == call_id and run.created >= after:
                return run
        return None


def questions(store: Store, origin_key: str) -> Questions:
    rows = store.query(
        "SELECT * FROM runs WHERE origin_key = ? AND kind = 'ask' AND call_id IS NOT NULL"
        " ORDER BY created",
        (origin_key,),
    )
    return Questions([_run(r) for r in rows])


def answered_with(store: Store, origin_key: str, ref: str) -> bool:
    """Whether the queued message `ref` answered a question of conversation `origin_key`
    (a worker took it as the answer: it needs no turn of its own)."""
    rows = store.query(
        "SELECT 1 FROM runs WHERE origin_key = ? AND kind = 'ask' AND answered_by = ? LIMIT 1",
        (origin_key, ref),
    )
    return bool(rows)


def cancel(store: Store, run_id: str) -> Run | None:
    """Cancel an open run; the row as it is now (None: no such run)."""
    with store.transaction() as c:
        c.execute(
            "UPDATE runs SET status = 'cancelled', finished = ?"
            " WHERE id = ? AND status IN ('running', 'waiting')",
            (time.time(), run_id),
        )
    return get(store, run_id)


def process_gone(pid: int | None) -> bool:
    """Whether the process that runs a run (its row's `pid`) has ended: such a run is open
    only until the next Heron process starts and marks it interrupted (`interrupt_orphans`)."""
    return pid is None or not pid_alive(pid)


def interrupt_orphans(store: Store) -> list[str]:
    """Runs left open by a process that no longer exists: marked interrupted (their result,
    whatever the lineage holds, is still owed to the origin)."""
    rows = store.query("SELECT id, pid FROM runs WHERE status IN ('running', 'waiting')")
    gone = [r["id"] for r in rows if process_gone(r["pid"])]
    with store.transaction() as c:
        for run_id in gone:
            c.execute(
                "UPDATE runs SET status = 'interrupted', finished = ? WHERE id = ?",
                (time.time(), run_id),
            )
    return gone


def owed(store: Store, origin_key: str | None = None) -> list[Run]:
    """Subagent runs that ended and whose result has not been marked announced (only those
    spawned in `origin_key` when given: by the (origin_key, status) index)."""
    marks = ", ".join("?" for _ in ENDED)
    origin = "" if origin_key is None else " AND origin_key = ?"
    rows = store.query(
        f"SELECT * FROM runs WHERE kind = 'subagent' AND announced IS NULL AND status IN ({marks})"
        + origin
        + " ORDER BY finished",
        (*ENDED, *(() if origin_key is None else (origin_key,))),
    )
    return [_run(r) for r in rows]


def in_record(store: Store, origin_key: str, run_id: str) -> bool:
    """Whether the origin conversation already holds the message carrying this run's result.
    The rows whose meta names the run are found by its id (unique, random) and their meta read
    here: a damaged meta is skipped, where PostgreSQL would fail the whole query casting it
    (it has no `json_valid` before version 16)."""
    rows = store.query(
        "SELECT m.meta FROM messages m JOIN conversations c ON c.id = m.conversation_id"
        " WHERE c.key = ? AND m.meta LIKE ?",
        (origin_key, f"%{run_id}%"),
    )
    return any(_names_run(r[0], run_id) for r in rows)


def _names_run(meta: str, run_id: str) -> bool:
    try:
        found = json.loads(meta)
    except ValueError:
        return False
    return isinstance(found, dict) and found.get(RUN_META) == run_id


def mark_announced(store: Store, run_id: str) -> None:
    with store.transaction() as c:
        c.execute(
            "UPDATE runs SET announced = COALESCE(announced, ?) WHERE id = ?",
            (time.time(), run_id),
        )


def expired_lineages(store: Store, origin_key: str, keep: int, ttl_s: float) -> list[str]:
    """Finished lineages of an origin past the retention: all but the newest `keep`, and any
    finished more than `ttl_s` ago (their conversations go; the run rows and results stay)."""
    marks = ", ".join("?" for _ in ENDED)
    rows = store.query(
        "SELECT lineage, finished FROM runs WHERE kind = 'subagent' AND origin_key = ?"
        f" AND lineage IS NOT NULL AND status IN ({marks}) AND announced IS NOT NULL"
        " ORDER BY finished DESC",
        (origin_key, *ENDED),
    )
    now = time.time()
    return [
        r["lineage"] for i, r in enumerate(rows) if i >= keep or now - (r["finished"] or 0) > ttl_s
    ]


def forget_lineage(store: Store, lineage: str) -> None:
    """A lineage past retention: it can no longer be resumed (its conversation is deleted)."""
    with store.transaction() as c:
        c.execute("UPDATE runs SET lineage = NULL WHERE lineage = ?", (lineage,))
    conv = store.conversation(f"subagent:{lineage}")
    if conv is not None:
        store.delete_conversation(conv.id)


def open_for(store: Store, origin_key: str) -> list[Run]:
    """What still owes this conversation something: subagents running or not yet announced,
    questions waiting for an answer before their deadline."""
    rows = store.query(
        "SELECT * FROM runs WHERE origin_key = ? AND ("
        " (kind = 'subagent' AND (status = 'running' OR announced IS NULL))"
        " OR (kind = 'ask' AND status = 'waiting' AND (deadline IS NULL OR deadline > ?)))"
        " AND status != 'cancelled' ORDER BY created",
        (origin_key, time.time()),
    )
    return [_run(r) for r in rows]


def open_work(store: Store) -> list[Run]:
    """The home's runs still going, oldest first: subagents running or waiting for a slot,
    and questions waiting for the person's answer before their deadline (`heron status`)."""
    rows = store.query(
        "SELECT * FROM runs WHERE (kind = 'subagent' AND status IN ('running', 'waiting'))"
        " OR (kind = 'ask' AND status = 'waiting' AND (deadline IS NULL OR deadline > ?))"
        " ORDER BY created",
        (time.time(),),
    )
    return [_run(r) for r in rows]


def work_in(store: Store, key: str) -> list[str]:
    """What proactive work still uses a conversation, each named with how to end it: a goal
    working in it, a subagent that will report back to it, a question waiting for an answer
    there (one past its deadline no longer counts), an active job bound to it. A delete is
    refused while any remains."""
    from heron.store.goals import open_goal
    from heron.store.jobs import list_jobs

    found: list[str] = []
    goal = open_goal(store, key)
    if goal is not None and goal.status == "active":
        found.append(
            f"a goal is working in it ({_short(goal.objective)}): end it with /goal stop there"
        )
    for run in open_for(store, key):
        if run.kind == "ask":
            found.append(
                f"run {run.id} waits for your answer ({_short(run.task)}): answer it, or drop it"
                f" with heron runs cancel {run.id}"
            )
        elif run.status in ("running", "waiting"):
            found.append(
                f"subagent {run.id} will report back to it: wait for its result, or stop it"
                f" with heron runs cancel {run.id}"
            )
        else:
            found.append(
                f"subagent {run.id} has not reported back yet ({run.status}): open the"
                f" conversation to receive it, or drop it with heron runs cancel {run.id}"
            )
    for job in list_jobs(store, conversation=key):
        found.append(
            f"{job.mode} job {job.id} is bound to it ({_short(job.prompt)}): cancel it with"
            f" heron jobs cancel {job.id}"
        )
    return found


def status_lines(store: Store, key: str, now: float, zone: str) -> list[str]:
    """/status: the conversation's open goal (its state, the budget used, the objective), then
    each subagent that will report back to it (id, state, time since it started, its task's
    first line) and each question waiting there for an answer; nothing when there is none."""
    from heron.store.goals import open_goal

    lines: list[str] = []
    goal = open_goal(store, key)
    if goal is not None:
        state = "parked (its budget ran out)" if goal.status == "parked" else goal.status
        lines.append(f"goal: {state}, {goal.budget()}: {_first_line(goal.objective, 80)}")
    for run in open_for(store, key):
        took = elapsed((now if run.status in ("running", "waiting") else run.finished or now)
                        - run.created)  # fmt: skip
        if run.kind == "ask":
            until = ""
            if run.deadline is not None:
                until = f" until {timefmt.when(run.deadline, zone, '%H:%M')}"
            lines.append(
                f"question {run.id}: waiting for your answer{until}, asked {took} ago:"
                f" {_first_line(run.task)}"
            )
            continue
        if run.status == "waiting":  # not started: no clock yet
            state = waiting_for_slot(store, run)
        elif run.status == "running":
            state = f"running, {took}"
        else:
            state = f"{run.status}, not reported back, {took}"
        lines.append(f"subagent {run.id}: {state}: {_first_line(run.task)}")
    return lines


def _first_line(text: str, limit: int = 60) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def elapsed(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def cancel_by_person(store: Store, run: Run) -> tuple[bool, str]:
    """The person cancels a run (`heron runs cancel`, the browser's cancel button): a running
    subagent stops at its turn's next commit in whatever process runs it, a waiting question
    is dropped, a finished subagent not yet reported has its result dropped. Returns whether
    anything changed and the sentence saying what."""
    ended = run.status not in ("running", "waiting", "cancelled")
    if run.kind == "subagent" and ended and not run.announced:
        drop_result(store, run.id)  # ended, not reported yet: its result is dropped
        return True, f"Dropped the result of subagent {run.id}; it will not report back."
    if run.status not in ("running", "waiting"):
        return False, f"Run {run.id} already ended ({run.status}); nothing to cancel."
    cancel(store, run.id)
    conv = store.conversation(run.conversation_key) if run.conversation_key else None
    if conv is not None:
        bump_epoch(store, conv.id)
    return True, f"Cancelled {run.kind} {run.id}."


def drop_result(store: Store, run_id: str) -> None:
    """The person drops a finished subagent's result before it was announced."""
    with store.transaction() as c:
        c.execute(
            "UPDATE runs SET announced = COALESCE(announced, ?), status = 'cancelled'"
            " WHERE id = ? AND announced IS NULL",
            (time.time(), run_id),
        )


def _short(text: str, limit: int = 60) -> str:
    line = " ".join(text.split())
    return repr(line if len(line) <= limit else line[: limit - 1] + "…")
