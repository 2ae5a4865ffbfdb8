"""Reading traces back: runs newest first, one run in full, its requests rebuilt, an export.

A damaged trace (a blob that is not JSON, a broken chain, a reply row that does not decode)
never stops a read: what cannot be read is named in `RunTrace.problems` and stands in as a
placeholder (no reply, no start, a request that says it is damaged).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from heron.errors import StoreError
from heron.messages import Reply, Usage, dumps, reply_from_dict
from heron.providers.wire import Streamed, streamed_from_dict
from heron.store import Store, StoredMessage, Turn
from heron.store.db import turn_from_row
from heron.store.records import RECALL_FLAG
from heron.trace import records
from heron.trace.blobs import get_blob, get_chain, rebuild

_T = TypeVar("_T")


@dataclass
class CallTrace:
    """One model call: the request as sent (rebuilt on demand), the reply, usage and timing."""

    id: int
    seq: int
    purpose: str
    reply: Reply | None
    error: str | None
    usage: Usage
    started: float
    ended: float | None
    request_ref: str | None  # None: an old row holding the whole payload in `request`
    raw_request: str
    streamed: Streamed | None = None  # stopped mid-stream: what had arrived (usage unknown)
    attempt: int = 1  # which run of the turn made it: 2 for the retry after a context overflow
    # Its attempts that failed and were tried again (a 529, a cut stream), in order: each the
    # body of its `retry` event ({"call", "attempt", "error", "wait"}). Each was sent, so each
    # is one of the turn's model calls.
    failed_attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return (self.ended or self.started) - self.started


@dataclass
class ToolTrace:
    call_id: str
    name: str
    args: str
    result: str | None
    result_sha256: str | None
    is_error: bool
    effects: list[dict[str, Any]]
    started: float
    ended: float | None
    after_call: int | None
    # Running when the run was stopped: `result` is its interrupted result, with what it had
    # printed (named by the run's `interrupted` event).
    interrupted: bool = False
    attempt: int = 1  # the run of the turn it belongs to (see CallTrace)

    @property
    def duration(self) -> float:
        return (self.ended or self.started) - self.started


@dataclass
class EventTrace:
    after_call: int
    kind: str  # injection | break | interrupted
    body: Any
    at: float
    attempt: int = 1  # the run of the turn it belongs to (see CallTrace)


@dataclass(frozen=True)
class RecalledCall:
    """Auto-recall's synthetic recall_history call of a run and the result it injected."""

    call_id: str
    name: str
    args: dict[str, Any]
    result: str


@dataclass
class RunTrace:
    turn: Turn
    conversation_key: str
    start: dict[str, Any] | None  # None for runs recorded before traces kept their start
    fingerprints: dict[str, str]
    calls: list[CallTrace] = field(default_factory=list)
    tools: list[ToolTrace] = field(default_factory=list)
    events: list[EventTrace] = field(default_factory=list)
    user_text: str = ""
    # Who wrote the message the run answers: "you", or "heron" for an opening Heron wrote (a
    # reminder's prompt, a heartbeat check, a subagent's result), never shown as the person's.
    user_by: str = "you"
    reply_text: str = ""  # what the user saw: the last assistant text of the turn
    problems: list[str] = field(default_factory=list)  # what of the trace could not be read
    # What auto-recall put before the user's message: its synthetic recall_history calls and
    # results (heron/memory/wiring.py), which no model call made, so no tool row records them.
    recalled: list[RecalledCall] = field(default_factory=list)


# What reading a damaged row or blob raises (JSON, UTF-8, a missing key or blob, a wrong type).
DAMAGE = (ValueError, TypeError, KeyError, AttributeError, IndexError)


def damaged(error: BaseException) -> bool:
    """Whether `error` comes from damaged data rather than from a failing database."""
    if isinstance(error, sqlite3.OperationalError):
        return "decode" in str(error)
    return isinstance(error, DAMAGE)


def request_payload(store: Store, call: CallTrace) -> str:
    """The exact JSON body that was sent for `call`; for a damaged trace, a JSON object whose
    `damaged` field says what could not be read."""
    if call.request_ref is None:
        return call.raw_request
    try:
        with store.transaction() as conn:
            return rebuild(conn, call.request_ref)
    except Exception as error:
        if not damaged(error):
            raise
        where = f"request_ref {call.request_ref[:120]}"
        return dumps(
            {"damaged": f"the request of call #{call.seq} ({where}) cannot be read: {error}"}
        )


def find_turn(store: Store, run_id: str) -> Turn:
    turn = store.turn(run_id)
    if turn is None:
        # A unique prefix is enough, as with git commits.
        ids = records.run_ids_like(store, run_id)
        if len(ids) == 1:
            turn = store.turn(ids[0])
    if turn is None and store.conversation(run_id) is not None:  # a key where a run id goes
        raise StoreError(
            f"no run {run_id!r}: {run_id!r} is a conversation, not a run",
            hint=f"`heron trace show {run_id} --stats` sums its runs; `heron trace ls -c "
            f"{run_id}` lists them with their ids.",
        )
    if turn is None:
        raise StoreError(
            f"no run {run_id!r}", hint="`heron trace ls` lists the runs with their ids."
        )
    return turn


def load_run(store: Store, run_id: str) -> RunTrace:
    turn = find_turn(store, run_id)
    key = store.conversation_by_id(turn.conversation_id).key
    problems: list[str] = []
    unread: tuple[dict[str, Any] | None, dict[str, str]] = (None, {})
    start = _readable(problems, "the run's start", lambda: _start(store, turn.id), unread)
    run = RunTrace(turn, key, *start, problems=problems)
    run.calls = [_call(r, problems) for r in records.model_call_rows(store, turn.id)]
    run.tools = [_tool(r, problems) for r in records.tool_call_rows(store, turn.id)]
    run.events = [
        EventTrace(
            r["after_call"],
            r["kind"],
            _readable(problems, f"event {r['id']}", partial(_json, r["body"], BODY), None),
            r["at"],
        )
        for r in records.event_rows(store, turn.id)
    ]
    _number_runs(run)
    _attach_retries(run)
    stopped = _stopped_calls(run.events)
    for tool in run.tools:
        tool.interrupted = tool.call_id in stopped
    run.user_text, reply, run.user_by = _texts(store, turn)
    run.reply_text = _with_cut_parts(run.calls, reply)
    run.recalled = _readable(problems, "the auto-recall rows", partial(_recalled, store, turn), [])
    return run


def _number_runs(run: RunTrace) -> None:
    """Which run of the turn each call, tool call and event belongs to. A turn runs again
    after a context overflow (heron/agent/turn.py), with a recorder of its own: its calls are
    numbered from 1 again, and its tool calls and events count those calls. A call whose
    number does not follow the one before starts the next run; a tool call or an event
    belongs to the last run begun by its time."""
    starts: list[float] = []
    previous = 0
    for call in run.calls:
        if call.seq <= previous or not starts:
            starts.append(call.started)
        call.attempt, previous = len(starts), call.seq
    if len(starts) < 2:
        return
    for tool in run.tools:
        tool.attempt = _run_at(starts, tool.started)
    for event in run.events:
        event.attempt = _run_at(starts, event.at)


def _attach_retries(run: RunTrace) -> None:
    """Each `retry` event to the call it names (by its number in the same run of the turn),
    out of the run's events: a failed attempt is part of its call, not something between
    calls. One naming no call stays an event."""
    calls = {(c.attempt, c.seq): c for c in run.calls}
    kept: list[EventTrace] = []
    for event in run.events:
        body = event.body if isinstance(event.body, dict) else {}
        number = body.get("call")
        call = calls.get((event.attempt, number)) if event.kind == "retry" and number else None
        if call is None:
            kept.append(event)
        else:
            call.failed_attempts.append(body)
    run.events = kept


def _run_at(starts: list[float], at: float) -> int:
    """The number of the last run begun at `at` (1 when before them all)."""
    return max(1, sum(1 for began in starts if began <= at))


def overflowed(error: str) -> bool:
    """Whether a call's recorded error (the exception's repr) is a context overflow."""
    return error.startswith("ContextOverflow(")


def later_runs(run: RunTrace) -> list[CallTrace]:
    """The calls of the turn's runs after its first (the retry after a context overflow)."""
    return [c for c in run.calls if c.attempt > 1]


def _stopped_calls(events: list[EventTrace]) -> set[str]:
    """The ids of the tool calls the run's `interrupted` event names as running at the stop."""
    bodies = (e.body for e in events if e.kind == "interrupted" and isinstance(e.body, dict))
    named = (body.get("tool_calls") for body in bodies)
    return {str(i) for ids in named if isinstance(ids, list) for i in ids}


def _recalled(store: Store, turn: Turn) -> list[RecalledCall]:
    """The auto-recall rows stored right before the turn's user message (outside any turn,
    flagged RECALL_FLAG): the calls and the results that answer them, in order."""
    if turn.user_message_id is None:
        return []
    rows: list[StoredMessage] = []
    parent = store.message(turn.user_message_id).parent_id
    while parent is not None:
        row = store.message(parent)
        if row.turn_id is not None or not row.meta.get(RECALL_FLAG):
            break
        rows.insert(0, row)
        parent = row.parent_id
    results = {r.call_id: r.content for row in rows for r in row.message.tool_results}
    return [
        RecalledCall(c.id, c.name, dict(c.args), results.get(c.id, ""))
        for row in rows
        for c in row.message.tool_calls
    ]


def _readable(problems: list[str], what: str, read: Callable[[], _T], instead: _T) -> _T:
    """`read()`, or `instead` with a note in `problems` naming what could not be read."""
    try:
        return read()
    except Exception as error:
        if not damaged(error):
            raise
        problems.append(f"{what} cannot be read from the trace: {error}")
        return instead


BODY = (list, dict)  # an event's body


def _json(raw: str | bytes | None, kind: type | tuple[type, ...] = object) -> Any:
    """A stored JSON value (None when empty), which must be of `kind`."""
    value = json.loads(raw) if raw else None
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"expected JSON {_name(kind)}, found {type(value).__name__}")
    return value


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names: dict[type, str] = {dict: "object", list: "array"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _start(store: Store, turn_id: int) -> tuple[dict[str, Any] | None, dict[str, str]]:
    row = records.run_start_row(store, turn_id)
    if row is None:
        return None, {}
    start = _named(f"trace_runs row of turn {turn_id}", _json, row["start"]) or {}
    if not isinstance(start, dict):
        raise TypeError(f"the start of turn {turn_id} is not a JSON object")
    with store.transaction() as conn:
        start["system"] = get_blob(conn, start["system"])
        if start.get("messages") is not None:
            node, count = start["messages"]
            bodies = get_chain(conn, node)[:count]
            start["messages"] = [
                _named(f"message chain to node {node}", json.loads, b) for b in bodies
            ]
        if start.get("prompt_inputs") is not None:
            blob = start["prompt_inputs"]
            start["prompt_inputs"] = _named(f"trace blob {blob}", json.loads, get_blob(conn, blob))
    fingerprints = _named(f"fingerprints of turn {turn_id}", _json, row["fingerprints"])
    if not isinstance(fingerprints or {}, dict):
        raise TypeError(f"the fingerprints of turn {turn_id} are not a JSON object")
    return start, fingerprints or {}


def _named(what: str, decode: Callable[[str], _T], raw: str) -> _T:
    """`decode(raw)`; a damaged value's error names where it was read from."""
    try:
        return decode(raw)
    except DAMAGE as error:
        raise ValueError(f"{what}: {error}") from error


def _call(r: sqlite3.Row, problems: list[str]) -> CallTrace:
    what = f"the reply of call #{r['seq']}"
    reply = _readable(problems, what, lambda: _reply(r["reply"]), None)
    usage = Usage(
        r["input_tokens"], r["output_tokens"], r["cache_read_tokens"], r["cache_write_tokens"]
    )
    return CallTrace(
        r["id"],
        r["seq"],
        r["purpose"],
        reply,
        r["error"],
        usage,
        r["started"],
        r["ended"],
        r["request_ref"],
        r["request"],
        _readable(problems, f"what call #{r['seq']} streamed", lambda: _streamed(r), None),
    )


def _streamed(r: sqlite3.Row) -> Streamed | None:
    raw = r["streamed"]
    return streamed_from_dict(_json(raw, dict)) if raw else None


def _reply(raw: str | None) -> Reply | None:
    return reply_from_dict(_json(raw, dict)) if raw else None


def _effects(raw: str | None) -> list[dict[str, Any]]:
    effects = _json(raw, list) or []
    if not all(isinstance(e, dict) for e in effects):
        raise TypeError("an effect is not a JSON object")
    return effects


def _tool(r: sqlite3.Row, problems: list[str]) -> ToolTrace:
    what = f"the effects of tool call {r['call_id']}"
    none: list[dict[str, Any]] = []
    effects = _readable(problems, what, lambda: _effects(r["effects"]), none)
    return ToolTrace(
        r["call_id"],
        r["name"],
        r["args"],
        r["result"],
        r["result_sha256"],
        bool(r["is_error"]),
        effects,
        r["started"],
        r["ended"],
        r["after_call"],
    )


def _texts(store: Store, turn: Turn) -> tuple[str, str, str]:
    """The run's opening message, its last reply, and who wrote the opening ("you"/"heron")."""
    rows = records.turn_message_rows(store, turn.id)
    user = assistant = ""
    by = "you"
    for row in rows:
        stored = store.message(row["id"])
        message = stored.message
        if row["id"] == turn.user_message_id:
            user, by = message.text, "heron" if stored.author == "heron" else "you"
        elif message.role == "assistant" and message.text.strip():
            assistant = message.text
    return user, assistant, by


def _with_cut_parts(calls: list[CallTrace], reply: str) -> str:
    """The reply as the person read it: a reply the output cap cut (`stop: length`) and the
    run continued is stored as one message per part, with Heron's "continue" between them, so
    the last message alone is only its last part. The parts are the texts of the calls before
    the last one that each stopped at the cap."""
    texts = [c.reply for c in calls if c.reply is not None and c.purpose == "turn"]
    if not texts or texts[-1].text != reply or not reply:
        return reply  # the stored reply is not the last call's (stopped, marked): as stored
    parts = [reply]
    for earlier in reversed(texts[:-1]):
        if earlier.stop != "length" or earlier.tool_calls or not earlier.text:
            break
        parts.insert(0, earlier.text)
    return "".join(parts)


@dataclass
class RunSummary:
    run_id: str
    conversation_key: str
    turn: Turn


def list_runs(
    store: Store, conversation_key: str | None = None, limit: int = 50
) -> list[RunSummary]:
    """Runs, newest first; only those of one conversation when `conversation_key` is given."""
    if conversation_key is not None and store.conversation(conversation_key) is None:
        raise StoreError(
            f"no conversation {conversation_key!r}",
            hint="`heron conversations list` shows the keys.",
        )
    rows = records.turn_rows(store, conversation_key, limit)
    return [RunSummary(r["run_id"], r["ckey"], turn_from_row(r)) for r in rows]


def requests_carrying(store: Store, needle: str, limit: int = 5) -> list[sqlite3.Row]:
    """The most recent model requests whose stored payload holds `needle` (conversation key,
    start time, run id, call number, purpose), from the trace as it is stored."""
    return records.requests_carrying_rows(store, needle, limit)
