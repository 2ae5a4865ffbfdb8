"""Reading traces back: runs newest first, one run in full, its requests rebuilt, an export."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from heron.errors import StoreError
from heron.messages import Reply, Usage, reply_from_dict
from heron.store import Store, Turn
from heron.store.db import turn_from_row
from heron.trace.blobs import get_blob, get_chain, rebuild


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

    @property
    def duration(self) -> float:
        return (self.ended or self.started) - self.started


@dataclass
class EventTrace:
    after_call: int
    kind: str  # injection | break | interrupted
    body: Any
    at: float


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
    reply_text: str = ""  # what the user saw: the last assistant text of the turn


def request_payload(store: Store, call: CallTrace) -> str:
    """The exact JSON body that was sent for `call`."""
    if call.request_ref is None:
        return call.raw_request
    with store.transaction() as conn:
        return rebuild(conn, call.request_ref)


def find_turn(store: Store, run_id: str) -> Turn:
    turn = store.turn(run_id)
    if turn is None:
        # A unique prefix is enough, as with git commits.
        rows = store.query("SELECT run_id FROM turns WHERE run_id LIKE ?", (f"{run_id}%",))
        if len(rows) == 1:
            turn = store.turn(rows[0][0])
    if turn is None:
        raise StoreError(
            f"no run {run_id!r}", hint="`heron trace ls` lists the runs with their ids."
        )
    return turn


def load_run(store: Store, run_id: str) -> RunTrace:
    turn = find_turn(store, run_id)
    key = store.conversation_by_id(turn.conversation_id).key
    run = RunTrace(turn, key, *_start(store, turn.id))
    run.calls = [
        _call(r)
        for r in store.query(
            "SELECT * FROM model_calls WHERE turn_id = ? ORDER BY seq, id", (turn.id,)
        )
    ]
    run.tools = [
        _tool(r)
        for r in store.query("SELECT * FROM tool_calls WHERE turn_id = ? ORDER BY id", (turn.id,))
    ]
    run.events = [
        EventTrace(
            r["after_call"], r["kind"], json.loads(r["body"]) if r["body"] else None, r["at"]
        )
        for r in store.query("SELECT * FROM trace_events WHERE turn_id = ? ORDER BY id", (turn.id,))
    ]
    run.user_text, run.reply_text = _texts(store, turn)
    return run


def _start(store: Store, turn_id: int) -> tuple[dict[str, Any] | None, dict[str, str]]:
    rows = store.query("SELECT start, fingerprints FROM trace_runs WHERE turn_id = ?", (turn_id,))
    if not rows:
        return None, {}
    start = json.loads(rows[0]["start"])
    with store.transaction() as conn:
        start["system"] = get_blob(conn, start["system"])
        if start.get("messages") is not None:
            node, count = start["messages"]
            start["messages"] = [json.loads(b) for b in get_chain(conn, node)][:count]
        if start.get("prompt_inputs") is not None:
            start["prompt_inputs"] = json.loads(get_blob(conn, start["prompt_inputs"]))
    return start, json.loads(rows[0]["fingerprints"] or "{}")


def _call(r: Any) -> CallTrace:
    reply = reply_from_dict(json.loads(r["reply"])) if r["reply"] else None
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
    )


def _tool(r: Any) -> ToolTrace:
    return ToolTrace(
        r["call_id"],
        r["name"],
        r["args"],
        r["result"],
        r["result_sha256"],
        bool(r["is_error"]),
        json.loads(r["effects"]) if r["effects"] else [],
        r["started"],
        r["ended"],
        r["after_call"],
    )


def _texts(store: Store, turn: Turn) -> tuple[str, str]:
    rows = store.query(
        "SELECT id, role, parts FROM messages WHERE turn_id = ? ORDER BY id", (turn.id,)
    )
    user = assistant = ""
    for row in rows:
        message = store.message(row["id"]).message
        if row["id"] == turn.user_message_id:
            user = message.text
        elif message.role == "assistant" and message.text.strip():
            assistant = message.text
    return user, assistant


@dataclass
class RunSummary:
    run_id: str
    conversation_key: str
    turn: Turn


def list_runs(
    store: Store, conversation_key: str | None = None, limit: int = 50
) -> list[RunSummary]:
    """Runs, newest first; only those of one conversation when `conversation_key` is given."""
    sql = "SELECT t.*, c.key AS ckey FROM turns t JOIN conversations c ON c.id = t.conversation_id"
    params: list[Any] = []
    if conversation_key is not None:
        if store.conversation(conversation_key) is None:
            raise StoreError(
                f"no conversation {conversation_key!r}",
                hint="`heron conversations list` shows the keys.",
            )
        sql += " WHERE c.key = ?"
        params.append(conversation_key)
    sql += " ORDER BY t.started DESC, t.id DESC LIMIT ?"
    params.append(limit)
    return [RunSummary(r["run_id"], r["ckey"], turn_from_row(r)) for r in store.query(sql, params)]
