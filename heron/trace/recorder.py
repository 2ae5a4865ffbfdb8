"""Recording one run: what it started from, every model call by reference, every tool call, and
the mailbox injections and breaks between them.

The engine owns one `TraceRecorder` per turn and calls it from its hooks. Every write is one
short transaction (inline; on a worker thread when the run's history is long, and always for a
maintenance run, `off_loop`), except a model
call's row, which the engine commits with the reply it produced (`model_call(defer=True)` and
`joined`). Every text written passes through the run's `Scrubber` first.

Events are ordered against model calls by `after_call` (how many model calls had completed), which
is where a replay puts them back:

    recorder.injection(messages)   # the mailbox delivered these before the next model call
    recorder.break_("soft")        # a break was taken (kind: soft | hard), with optional detail
    drain = recorder.drain(drain)  # or wrap a mailbox drain so every delivery is recorded
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeAlias

from heron.messages import (
    JSONObject,
    JSONValue,
    Message,
    Reply,
    ToolCall,
    ToolResult,
    Usage,
    dumps,
    message_json,
    message_to_dict,
    reply_to_dict,
)
from heron.providers.wire import (
    EncodedDict,
    EncodedList,
    FailedAttempt,
    Streamed,
    WireBody,
    dumps_fields,
    encoded,
    streamed_to_dict,
)
from heron.request import ToolSpec
from heron.store import Store
from heron.store.db import LONG_BRANCH
from heron.trace import records
from heron.trace.blobs import (
    ChainCache,
    KnownBlobs,
    Link,
    TraceCache,
    chain_links,
    put_chain,
    put_encoded,
    put_payload,
)
from heron.trace.scrub import Scrubber


@dataclass(frozen=True)
class TraceFixed:
    """What every run's trace takes from the engine's settings, which do not change while it
    runs: worked out on its first turn (the key scan of the environment included)."""

    profile: EncodedDict
    limits: EncodedDict
    scrubber: Scrubber


@dataclass
class RunStart:
    """What a run started from: enough to rebuild its first request with the current code."""

    agent: str
    provider: str  # the wire the payloads were built for (openai, anthropic, scripted)
    model: str
    system: str  # the system prompt as sent
    profile: JSONObject = field(default_factory=dict)
    limits: JSONObject = field(default_factory=dict)
    prompt_inputs: JSONObject | None = None  # PromptInputs as plain data, if known
    user_message_id: int | None = None  # the run starts from the branch ending here
    start_messages: int = 0  # how many messages the run started with
    clock: float = field(default_factory=time.time)
    fenced: bool = False  # tool calls travelled as text (FencedTools)
    # What the compaction governor started from (window, calibration), so a replay rebuilds it.
    context: JSONObject = field(default_factory=dict)


# One write of the trace, run inside a store transaction.
Write: TypeAlias = Callable[[sqlite3.Connection], None]
# The prompt inputs of a run as plain data, or with their JSON and fingerprints as the prompt
# memo keeps them (heron/agent/tracing.py).
Inputs: TypeAlias = "JSONObject | tuple[JSONObject, str, dict[str, str]]"


class RecordedCall(Protocol):
    """One tool call as the runner records it (heron/agent/runner.py ToolCallRecord)."""

    @property
    def call(self) -> ToolCall: ...
    @property
    def result(self) -> ToolResult: ...
    @property
    def effects(self) -> Sequence[Mapping[str, object]]: ...
    @property
    def started(self) -> float: ...
    @property
    def ended(self) -> float: ...


def _in_order(bodies: list[Write]) -> Write:
    """One write body that runs `bodies` in order on the same connection."""

    def run(conn: sqlite3.Connection) -> None:
        for body in bodies:
            body(conn)

    return run


def inputs_json(inputs: JSONObject) -> str:
    """`dumps(inputs)`, with the tools taken as already encoded (see `plain`)."""
    return dumps_fields(inputs)


def plain_fields(value: object) -> JSONObject:
    """A dataclass instance (PromptInputs, ModelProfile, RunLimits) as a JSON object."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        raise TypeError(f"not a dataclass instance: {value!r}")
    fields = dataclasses.fields(value)
    return {f.name: plain(getattr(value, f.name)) for f in fields}  # probe: by field name


def plain(value: object) -> JSONValue:
    """A dataclass (PromptInputs, ToolSpec, ModelProfile) as JSON-ready data."""
    if isinstance(value, list) and value and all(isinstance(v, ToolSpec) for v in value):
        # The specs' kept encodings make the list's: no schema is encoded again each turn.
        tools = EncodedList(plain(v) for v in value)
        tools.json = "[" + ",".join(v.json for v in value) + "]"
        return tools
    if isinstance(value, ToolSpec):  # its schema is JSON data already: not walked every turn
        params = value.parameters
        return {"name": value.name, "description": value.description, "parameters": params}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain_fields(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float):
        return value
    raise TypeError(f"not JSON data: {value!r}")


def fingerprints(start: RunStart) -> dict[str, str]:
    """Short digests of the prompt pieces, so prompt drift shows in data."""
    out = {"system": _fp(start.system)}
    inputs = start.prompt_inputs or {}
    if inputs.get("tools") is not None:
        out["tools"] = _fp(encoded(inputs["tools"]))
    bootstrap = inputs.get("bootstrap")
    if isinstance(bootstrap, Mapping):
        for name in sorted(bootstrap):
            text = bootstrap[name]
            out[name] = _fp(text if isinstance(text, str) else dumps(text))
    return out


def _fp(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class TraceRecorder:
    def __init__(
        self,
        store: Store,
        turn_id: int,
        start: RunStart,
        scrubber: Scrubber,
        messages: list[Message] | None = None,
        inputs: Callable[[], Inputs | None] | None = None,
        *,
        own_chain: bool = False,
        off_loop: bool = False,
    ) -> None:
        self.store = store
        # Every write on a worker thread (a maintenance run: its requests carry whole
        # transcripts, a summary's, and no person waits on them), not only a long run's.
        self._off_loop = off_loop
        # A maintenance run's requests (a summary's, a memory review's) are no prefix of the
        # conversation's next turn: its message chain is its own, neither read nor kept as
        # the conversation's last.
        self._own_chain = own_chain
        self._inputs = inputs  # computes start.prompt_inputs before the first write
        self._inputs_json: str | None = None  # their JSON, when it came with them
        self._fingerprints: dict[str, str] | None = None  # and the prompt's fingerprints
        self.messages = messages or []  # what the run started from (the model-facing view)
        self.turn_id = turn_id
        self.start = start
        self.scrub = scrubber
        self.calls = 0  # model calls recorded so far: the clock events are ordered by
        self._chain = ChainCache()
        # What the store's earlier trace writes left on disk,
        # and the blobs this write transaction found (see `_write`).
        self._cache = trace_cache(store)
        self._known = KnownBlobs(self._cache)
        self._conversation: int | None = None  # the turn's, read with the start
        self._started = False
        # Events noticed in synchronous hooks, written with the next write: (kind, body, after).
        self._pending: list[tuple[str, object, int]] = []
        # Model calls held for the next write (`model_call(defer=True)`, `write_deferred`).
        self._deferred: list[Write] = []
        # The tool calls running when the run was stopped (`tool_call(stopped=True)`).
        self._stopped: list[str] = []

    # ---- the run's start --------------------------------------------------------------------

    def _ensure_start(self, conn: sqlite3.Connection) -> None:
        if self._started:
            return
        # Shallow: the fields are plain data already, and asdict's deep copy of the prompt
        # inputs (every tool schema) was the largest cost of a turn's trace.
        fields = dataclasses.fields(self.start)
        start = {f.name: getattr(self.start, f.name) for f in fields}  # probe: by field name
        row = records.turn_start_ids(conn, self.turn_id)
        self._conversation = row[0] if row and not self._own_chain else None
        if start["user_message_id"] is None:
            start["user_message_id"] = row[1] if row else None
        system = self.scrub.clean(self.start.system)
        start["system"] = self._known.blob(conn, "system_prompt", system)
        bodies = [self.scrub.clean(message_json(m)) for m in self.messages]
        seen = ChainCache(self._previous_chain(conn))  # only what is new is looked up
        start["messages"] = [put_chain(conn, bodies, seen), len(bodies)]
        self._chain.links = seen.links  # the run's first request shares the start's messages
        inputs = start.pop("prompt_inputs")
        if inputs is not None:
            text = self.scrub.clean(self._inputs_json or inputs_json(inputs))
            start["prompt_inputs"] = self._known.blob(conn, "prompt_inputs", text)
        records.insert_run_start(
            conn,
            self.turn_id,
            dumps_fields(start),  # the profile and limits come encoded (engine_fixed)
            dumps(self._fingerprints or fingerprints(self.start)),
        )
        self._started = True

    def _previous_chain(self, conn: sqlite3.Connection) -> list[Link]:
        try:
            return self._read_previous_chain(conn)
        except Exception as error:
            from heron.trace.read import damaged  # here: trace reading is not a turn's path

            if not damaged(error):
                raise
            # A damaged trace row: this run's chain starts afresh (a little more stored,
            # nothing lost), and the turn goes on.
            return []

    def _read_previous_chain(self, conn: sqlite3.Connection) -> list[Link]:
        """The conversation's last message chain written (its last request's, else its last
        run start's): this run starts from the same messages plus the last exchange. Kept by
        the store's TraceCache; read from the database when it does not know the chain."""
        conversation = self._conversation
        if conversation is None:
            return []
        kept = self._cache.chain(conversation)
        if kept is not None:
            return kept
        ref = records.last_request_ref(conn, conversation)
        node = (json.loads(ref).get("messages") or [0])[0] if ref else 0
        if not node:
            start = records.previous_run_start(conn, conversation, self.turn_id)
            node = (json.loads(start).get("messages") or [0])[0] if start else 0
        return chain_links(conn, node) if node else []

    async def begin(self) -> None:
        await self._run(lambda conn: None)

    def _long(self) -> bool:
        # A write is a few rows (Store.call, inline); one that chains a long history of
        # messages (thousands of digests and lookups) goes off the loop.
        return self._off_loop or len(self.messages) >= LONG_BRANCH

    async def _run(self, body: Write) -> None:
        pending, self._pending = self._pending, []
        held, self._deferred = self._deferred, []
        bodies = [*held, body]
        try:
            await self.store.call(self._write, _in_order(bodies), pending, off_loop=self._long())
        except BaseException:  # rolled back: held again for the next write
            self._deferred, self._pending = [*held, *self._deferred], [*pending, *self._pending]
            raise

    @contextmanager
    def joined(self) -> Iterator[None]:
        """Write what is held (the start, deferred model calls, pending events) inside the
        caller's open transaction, so the engine stores a reply and its model call's row in one
        commit. Should the caller's transaction fail, all of it is held again for the next
        write (the rollback took it away)."""
        started, held, pending = self._started, self._deferred, self._pending
        links = self._chain.links
        try:
            if not (started and not held and not pending):
                self._deferred, self._pending = [], []
                self._write(_in_order(held), pending)
            yield
        except BaseException:
            self._started, self._chain.links = started, links  # those rows were rolled back
            self._deferred, self._pending = [*held, *self._deferred], [*pending, *self._pending]
            raise

    def _write(self, body: Write, pending: list[tuple[str, object, int]]) -> None:
        if self._inputs is not None:  # file reads and a prompt build: off the loop, once
            inputs_fn, self._inputs = self._inputs, None
            found = inputs_fn()
            if isinstance(found, tuple):  # (data, JSON, fingerprints) as the memo keeps them
                self.start.prompt_inputs, self._inputs_json, self._fingerprints = found
            else:
                self.start.prompt_inputs = found
        started, links = self._started, self._chain.links
        try:
            with self.store.transaction() as conn:
                self._cache.check(conn)  # inside the transaction: see TraceCache
                self._known = KnownBlobs(self._cache)
                self._ensure_start(conn)
                for kind, value, after in pending:
                    self._insert_event(conn, kind, value, after)
                body(conn)
                self._keep_on_commit()
        except BaseException:
            # Rolled back: the start and the chain's new nodes are not on disk.
            self._started, self._chain.links = started, links
            raise

    def _keep_on_commit(self) -> None:
        """Hand the chain and blobs this write left on disk to the store's cache once the
        transaction (the caller's, when joined) commits; a rollback drops the hook."""
        keep = functools.partial(
            self._cache.keep, self._conversation, self._chain.links, self._known.found
        )
        self.store.after_commit.append(keep)

    def _insert_event(self, conn: sqlite3.Connection, kind: str, value: object, after: int) -> None:
        text = self.scrub.clean(dumps(value)) if value is not None else None
        records.insert_event(conn, self.turn_id, after, kind, text, time.time())

    # ---- model and tool calls ---------------------------------------------------------------

    async def model_call(
        self,
        seq: int,
        purpose: str,
        payload: str,
        reply: Reply | None,
        error: str | None,
        started: float,
        ended: float,
        body: WireBody | None = None,
        *,
        streamed: Streamed | None = None,
        failed: Sequence[FailedAttempt] = (),
        defer: bool = False,
    ) -> None:
        """Record one model call. `streamed`: the call was stopped mid-stream, this is what
        had arrived (its usage, if any, is the row's). `failed`: its attempts that failed
        and were tried again, each a `retry` event naming the call (read back with it).
        `defer`: hold the row for the next write (the reply's own transaction, see
        `joined`) unless the run's history is long (off the loop)."""
        usage = reply.usage if reply is not None else Usage()
        if streamed is not None:
            usage = streamed.usage or Usage()
        retries, after = self._retries(seq, failed), self.calls  # the calls done before it
        self.calls += 1
        reply_json = self.scrub.clean(dumps(reply_to_dict(reply))) if reply is not None else None
        partial = self.scrub.clean(dumps(streamed_to_dict(streamed))) if streamed else None
        # The body's pieces are stored as they are, unless a secret must be cut out of them.
        pieces = body if body is not None and not self.scrub.found_in(payload) else None
        request = payload if pieces is not None else self.scrub.clean(payload)

        def write(conn: sqlite3.Connection) -> None:
            if pieces is not None:
                ref = put_encoded(conn, pieces.value, pieces.pieces, self._chain, self._known)
            else:
                ref = put_payload(conn, request, self._chain, self._known)
            for at, body in retries:
                records.insert_event(conn, self.turn_id, after, "retry", body, at)
            records.insert_model_call(
                conn,
                (
                    self.turn_id,
                    seq,
                    purpose,
                    ref,
                    reply_json,
                    self.scrub.clean_opt(error),
                    usage.input,
                    usage.output,
                    usage.cache_read,
                    usage.cache_write,
                    started,
                    ended,
                    partial,
                ),
            )

        if defer and not self._long():
            self._deferred.append(write)
            return
        await self._run(write)

    def _retries(self, seq: int, failed: Sequence[FailedAttempt]) -> list[tuple[float, str]]:
        """The `retry` events of call `seq`'s failed attempts: when each failed, and its body
        (the call, the attempt's number, its error, the wait before the next)."""
        return [
            (
                attempt.at,
                self.scrub.clean(
                    dumps({"call": seq, "attempt": n, "error": attempt.error, "wait": attempt.wait})
                ),
            )
            for n, attempt in enumerate(failed, 1)
        ]

    async def tool_call(self, record: RecordedCall, args: str, *, stopped: bool = False) -> None:
        """`record` is a runner ToolCallRecord; `args` its arguments as recorded JSON.
        `stopped`: the run was stopped while the call ran (its result is the interrupted one):
        the run's `interrupted` event names it."""
        if stopped:
            self._stopped.append(record.call.id)
        content = self.scrub.clean(record.result.content)
        effects = self.scrub.clean(dumps(record.effects)) if record.effects else None
        after = self.calls

        def write(conn: sqlite3.Connection) -> None:
            records.insert_tool_call(
                conn,
                (
                    self.turn_id,
                    record.call.id,
                    record.call.name,
                    self.scrub.clean(args),
                    content,
                    hashlib.sha256(content.encode()).hexdigest(),
                    record.result.is_error,
                    effects,
                    record.started,
                    record.ended,
                    after,
                ),
            )

        await self._run(write)

    # ---- events -----------------------------------------------------------------------------

    async def event(self, kind: str, body: object = None) -> None:
        after = self.calls
        await self._run(lambda conn: self._insert_event(conn, kind, body, after))

    def notice(self, text: str, shown: bool = True) -> None:
        """What the person was told during the run (a fold, a checkpoint, a tight window, a
        memory pass that did not run), written with the next write; `shown` False: kept here
        only, as the person was told it before."""
        body = {"text": text} if shown else {"text": text, "shown": False}
        self._pending.append(("notice", body, self.calls))

    async def injection(self, messages: list[Message]) -> None:
        """The mailbox delivered `messages` into the run before its next model call."""
        if messages:
            await self.event("injection", [message_to_dict(m) for m in messages])

    async def break_(self, kind: str, **detail: object) -> None:
        """A break was taken: `soft` (wrap up at the next drain) or `hard` (stopped)."""
        await self.event("break", {"kind": kind, **detail})

    def drain(
        self, inner: Callable[[], Awaitable[list[Message]]]
    ) -> Callable[[], Awaitable[list[Message]]]:
        """Wrap a mailbox drain so that every non-empty delivery is recorded."""

        async def drain() -> list[Message]:
            messages = await inner()
            await self.injection(messages)
            return messages

        return drain

    async def finish(self, status: str) -> None:
        if status == "interrupted":
            body: JSONObject = {"after_call": self.calls}
            if self._stopped:  # the calls running when it stopped (their rows are written)
                body["tool_calls"] = list(self._stopped)
            await self.event("interrupted", body)
        elif not self._started or self._pending or self._deferred:
            await self.begin()  # the start (a run may end before any call) and pending events

    # ---- hooks ------------------------------------------------------------------------------

    def breaks(self, should_break: Callable[[], bool]) -> Callable[[], bool]:
        """Wrap a soft-break check so that a break taken is recorded as an event."""

        def checked() -> bool:
            taken = bool(should_break())
            if taken:  # the check is synchronous; the row is written by the next write
                self._pending.append(("break", {"kind": "soft"}, self.calls))
            return taken

        return checked


def trace_cache(store: Store) -> TraceCache:
    """The store's TraceCache (one per connection), made on first use."""
    cache = store.trace_cache
    if not isinstance(cache, TraceCache):  # none yet (or the connection reopened)
        cache = store.trace_cache = TraceCache()
    return cache
