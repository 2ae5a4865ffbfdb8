"""What the engine asks of memory on every turn, kept here so the engine's own edits stay small.

    prompt_sections   the frozen Memory section and the Recent history section of a conversation
    memory_note       what changed in memory since the section was frozen, announced once
    recall_rows       auto-recall: a synthetic recall_history call and result, stored as rows
                      just before the user's message so every later request replays them
    RecallReader      auto-recall's search on a connection of its own, on a thread and then in
                      a child process (busy engine)
    before_fold       the compaction extraction pass (writes only to the review queue)
    after_fold        thaw the frozen section, so the next prompt takes memory as it is now
    lazy_recall       a Recall whose embedding model loads on first semantic search, never at
                      start-up (loading it takes seconds when torch is installed)

Everything here is synchronous and short unless marked async; the engine calls it off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from heron.context.tokens import Calibration, estimate_request
from heron.memory import records
from heron.memory.auto import RESULT_CHARS, auto_messages, fires
from heron.memory.recall import Recall, wants_recall
from heron.memory.recall_process import RecallProcess
from heron.memory.section import (
    FrozenMemory,
    HistoryEntry,
    frozen_memory,
    history_floor,
    memory_section,
    recent_history_section,
    set_history_floor,
)
from heron.memory.service import MemoryService
from heron.messages import Message, Reply, Text, ToolResult
from heron.request import ChatRequest
from heron.store import Store, StoredMessage
from heron.store.records import RECALL_FLAG  # re-exported: the engine and tests read it here

if TYPE_CHECKING:
    from heron.providers.base import Provider

log = logging.getLogger(__name__)

RECALL_QUERY_CHARS = 2_000  # what auto-recall searches for of a user's message: its start


# ---- the prompt -------------------------------------------------------------------------------


def _snapshot(store: Store, service: MemoryService, conversation_id: int) -> tuple[str, float]:
    """The conversation's frozen section and when it was taken; taken now on first use. Reading
    never announces changes: that is `memory_note`'s job, once, in the runtime block."""
    row = records.snapshot(store, conversation_id)
    if row is None or row["thawed"]:  # a thawed one is blank: taken again (what is removed)
        _frozen(service, conversation_id)
        row = records.snapshot(store, conversation_id)
        assert row is not None  # frozen_memory just took it
    return row["section"], row["taken"]


def history_entries(store: Store, conversation_id: int, until: float) -> list[HistoryEntry]:
    """What other conversations folded away (their consolidation summaries) up to `until`:
    this conversation's own summary is already the prompt's archived summary."""
    out = []
    for r in records.consolidations_elsewhere(store, conversation_id, until):
        facts = (json.loads(r["meta"]) if r["meta"] else {}).get("facts") or r["summary"]
        out.append(HistoryEntry(r["created"], f"{r['key']}: {facts}"))
    return out


def prompt_sections(
    store: Store, service: MemoryService | None, conversation_id: int | None, take: bool = True
) -> tuple[str, str]:
    """(memory section, recent history section) for the system prompt. Both are fixed from the
    moment the memory section was frozen, so the prompt's bytes move only when a compaction or
    /new thaws it. `take=False` (a look at the next request): a section not frozen yet is
    read as the next turn would freeze it, and is not frozen."""
    if service is None or conversation_id is None:
        return "", ""
    row = None if take else records.snapshot(store, conversation_id)
    if take or (row is not None and not row["thawed"]):
        section, taken = _snapshot(store, service, conversation_id)
    else:
        section = memory_section(service.entries(), service.section_tokens, service.timezone)
        taken = time.time()
    entries = history_entries(store, conversation_id, taken)
    cap = service.section_tokens or 8_000  # other conversations' summaries: memory's share
    floor = history_floor(store, conversation_id)
    recent = recent_history_section(
        entries, floor=floor, max_tokens=min(8_000, cap), zone=service.timezone
    )
    return _untitled(section), _untitled(recent)


def _untitled(section: str) -> str:
    """The sections carry their own '# ...' title; the prompt builder adds its own."""
    first, _, rest = section.partition("\n")
    return rest.strip() if first.startswith("# ") else section


def memory_note(service: MemoryService | None, conversation_id: int) -> str | None:
    """What changed since the frozen section, for this turn's runtime block (once)."""
    if service is None:
        return None
    return _frozen(service, conversation_id).note


def _frozen(service: MemoryService, conversation_id: int) -> FrozenMemory:
    """The conversation's frozen section and what changed since, from memory as it is now."""
    entries = service.entries()
    tokens, zone = service.section_tokens, service.timezone
    return frozen_memory(service.store, conversation_id, entries, tokens, zone)


def thaw(service: MemoryService | None, conversation_id: int, *, new: bool = False) -> None:
    """After a compaction or /new: the next prompt takes memory as it is; /new also raises the
    floor of recent history so what the user cleared does not come back."""
    if service is None:
        return
    service.mark_thawed(conversation_id)
    if new:
        set_history_floor(service.store, conversation_id)


# ---- auto-recall ------------------------------------------------------------------------------


SMALL_HISTORY = 10_000  # messages: below it a search and the memory note take well under 1 ms


def search_is_slow(store: Store) -> bool:
    """Whether the history is large enough that auto-recall belongs on a worker thread (the
    largest message id, read from the primary key, stands in for the count)."""
    return records.max_message_id(store) > SMALL_HISTORY


@dataclass(frozen=True)
class Seen:
    """What the model already sees of the history: the conversation's rows in its view (the
    branch after /new and after the fold) and the messages that earlier auto-recalls still in
    view cited."""

    rows: frozenset[int]
    cited: frozenset[int]

    @property
    def ids(self) -> set[int]:
        return set(self.rows | self.cited)


def seen_by_model(store: Store, conversation_id: int) -> Seen:
    from heron.context.history import load_branch

    state = load_branch(store, conversation_id)
    upto = state.plan.folded_upto
    rows: set[int] = set()
    cited: set[int] = set()
    for row in state.rows:
        if upto is not None and row.id <= upto:
            continue
        rows.add(row.id)
        cited.update(row.meta.get("recalled", ()))
    return Seen(frozenset(rows), frozenset(cited))


# Older messages of a conversation `unseen_own` reads the dates of, at most: past them it
# answers yes (the conversation's own search then runs, as it always did).
UNSEEN_LOOK = 1_000


def unseen_own(store: Store, conversation_id: int, seen: Seen, since: float) -> bool:
    """Whether the conversation may hold a message auto-recall could show: one out of the
    model's view written at `since` (the /new floor) or later. No only when none can be: every
    message from the lowest one in view on is in view, and every older one (all of them when
    none is in view) was written before `since`. A yes where it cannot tell."""
    if seen.rows:
        lowest = min(seen.rows)
        # the rows in view are all the conversation's, all from `lowest` on
        if records.messages_from(store, conversation_id, lowest) > len(seen.rows):
            return True
    else:
        lowest = None
    return records.written_since(store, conversation_id, since, lowest, UNSEEN_LOOK)


def own_to_show(store: Store, conversation_id: int) -> bool:
    """`unseen_own` with what the model sees now and the conversation's /new floor: asked
    before auto-recall's check runs off the engine's thread (RecallReader). Yes without a
    look in a small history (`search_is_slow`): there the conversation's own search costs
    less than the look (docs/memory.md)."""
    if not search_is_slow(store):
        return True
    seen = seen_by_model(store, conversation_id)
    return unseen_own(store, conversation_id, seen, history_floor(store, conversation_id))


# Checks the thread answers before the child process starts: starting it costs about 0.2 s of
# CPU (an interpreter and its imports), which a short burst of overlapping turns (10
# conversations x 5 turns) never earns back; a sustained one earns it back within a second.
CHILD_AFTER = 100


class RecallReader:
    """Auto-recall's check (`auto.fires`) off the event loop, on a connection of its own:
    first on a thread, then, once the overlap lasts (`CHILD_AFTER` checks), in a child process.

    The check is full-text searching: most of its time is inside SQLite, which releases the
    GIL. Inline, that time blocks the event loop; on the main connection's worker it would
    still hold the Store's lock the loop needs. On one dedicated thread with a second
    connection (WAL lets it read while the engine writes) it runs on the other core, but its
    Python between queries still competes with the loop for the GIL; the child process
    (`heron.memory.recall_process`) does not. The thread stays for the child's start-up and
    for any check the child cannot answer. Never used for a lone turn (the engine checks
    inline then: a hop costs more than it saves)."""

    def __init__(self, path: Any, zone: str | None = None) -> None:
        self.path = path
        self.zone = zone  # the agent's: a query's months and years are read in it
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heron-recall")
        self._recall: Recall | None = None
        self._child: RecallProcess | None = None
        self._starting: asyncio.Task[None] | None = None
        self._asked = 0  # checks answered on the thread

    async def strong(self, text: str, conversation_id: int, own: bool = True) -> bool:
        """Whether `text`, typed in the conversation, has a hit passing auto-recall's gate in
        the committed history (`own` False: in other conversations only, see `own_to_show`):
        from the child process once it runs (started after `CHILD_AFTER` checks), from the
        thread until then or whenever the child cannot answer."""
        text = text[:RECALL_QUERY_CHARS]
        child = self._child
        if child is not None:
            answer = await child.ask(text, conversation_id, own)
            if answer is not None:
                return answer
        elif self._starting is None and self._asked >= CHILD_AFTER:
            self._starting = asyncio.create_task(self._start_child())
        self._asked += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._check, text, conversation_id, own)

    async def _start_child(self) -> None:
        try:
            self._child = await RecallProcess.start(self.path, self.zone)
        except Exception as e:  # whatever stops it, the thread keeps answering
            log.warning("auto-recall stays on a thread: cannot start its process: %s", e)

    def _check(self, text: str, conversation_id: int, own: bool) -> bool:
        if self._recall is None:
            self._recall = Recall(Store(self.path), zone=self.zone)
        return fires(self._recall, text, conversation_id, own=own)

    async def aclose(self) -> None:
        """Stop the child (waiting for it to exit), then close the thread's connection."""
        if self._starting is not None:
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
        if self._child is not None:
            await self._child.aclose()
            self._child = None
        self.close()

    def close(self) -> None:
        """Close the connection on its own thread, then the thread."""
        if self._recall is not None:
            self._pool.submit(self._recall.store.close).result()
            self._recall = None
        self._pool.shutdown(wait=True)


def recall_rows(
    store: Store,
    recall: Recall | None,
    conversation_id: int,
    text: str,
    strong: bool | None = None,
    *,
    max_chars: int = RESULT_CHARS,
) -> list[StoredMessage]:
    """Auto-recall before a turn (heron/memory/auto.py): the hits for `text` not in view, as a
    synthetic recall_history call and result stored at the head (the user's message goes
    right after them), so the cached prefix before them is untouched and later requests replay
    them as they were. `strong`: the answer of `auto.fires` when already known (RecallReader),
    else None; `max_chars`: the view's budget for one recall result."""
    if recall is None or not wants_recall(text) or strong is False:
        return []
    text = text[:RECALL_QUERY_CHARS]  # a pasted log is searched by its start, not all of it
    call_id = f"recall_{secrets.token_hex(4)}"
    since = history_floor(store, conversation_id)
    in_view: set[int] | Callable[[], set[int]]
    if search_is_slow(store):
        # What the model sees is read first (the engine keeps the branch decoded: a few
        # queries), so that the conversation's own search, a millisecond or two in a large
        # history, is skipped when none of its messages could be shown.
        seen = seen_by_model(store, conversation_id)
        in_view, own = seen.ids, unseen_own(store, conversation_id, seen, since)
    else:  # searching costs less than the look: only a hit loads the view
        in_view, own = (lambda: seen_by_model(store, conversation_id).ids), True
    found = auto_messages(  # the same gate as `fires`, asked once: [] loads nothing else
        recall,
        text,
        conversation_id,
        in_view,
        max_chars=max_chars,
        call_id=call_id,
        since=since,
        own=own,
        # the current branch, folded rows included (the store keeps it decoded): none of what
        # /retry, /edit or /tree left behind is shown; read only when a hit of its own passes
        branch=lambda: {r.id for r in store.branch(conversation_id)},
    )
    if not found:
        return []
    result = found[1].tool_results[0]
    ids = _cited(store, result)
    with store.transaction():
        return [
            store.append(conversation_id, m, meta={RECALL_FLAG: True, "recalled": ids})
            for m in found
        ]


def auto_recall_chars(window: int, share: float) -> int:
    """What auto-recall's result may take: the view's budget for one recall result (`share`
    of the window, as compaction's `Budget.recall_chars` counts it), so the view never cuts
    it, and never more than RESULT_CHARS, so a large window still gets a small result."""
    return min(RESULT_CHARS, max(500, int(window * share) * 4))


def _cited(store: Store, result: ToolResult) -> list[int]:
    """The message ids a recall result cites (its lines say 'message N')."""
    return [int(n) for n in re.findall(r"· message (\d+) ·", result.content)]


# ---- compaction -------------------------------------------------------------------------------


class InputBudget(Protocol):
    """The part of compaction's budget the fold pass reads (compaction.core.Budget)."""

    @property
    def input(self) -> int: ...


class FoldDeps(Protocol):
    """What the fold pass needs of compaction's dependencies (compaction.core.ContextDeps)."""

    @property
    def provider(self) -> Provider: ...

    @property
    def budget(self) -> InputBudget: ...

    @property
    def calibration(self) -> Calibration: ...

    async def chat(self, request: ChatRequest, purpose: str) -> Reply: ...


ROOM_SLACK = 64  # tokens kept free of a pass's prompt for the estimate's rounding


class _DepsProvider:
    """The extraction pass's calls go through compaction's `deps.chat`, so the turn's trace
    records them (purpose "memory") like the summary call; why a call failed is kept."""

    def __init__(self, deps: FoldDeps) -> None:
        self.deps = deps
        self.model = deps.provider.model
        self.failed: str | None = None

    async def chat(self, request: ChatRequest) -> Reply:
        try:
            return await self.deps.chat(request, "memory")
        except Exception as e:
            self.failed = str(e) or type(e).__name__
            raise

    def room(self, system: str) -> int:
        """What `deps.chat` lets through under `system`: the request's calibrated estimate
        within the input budget. A room counted raw against the window passed the check's
        count at a factor over 1, and every full pass was refused unsent (qa21q M5)."""
        cal = self.deps.calibration
        fixed = estimate_request(system, [], [Message("user", [Text("")])], cal).total
        return int((self.deps.budget.input - fixed) / max(cal.factor, 0.01)) - ROOM_SLACK


# Told where the person sees notices when a fold's memory pass did not run (and in the trace).
FOLD_PASS_FAILED = (
    "Memory's pass over the {n} folded messages did not run ({why}); nothing is lost: the next "
    "memory review reads them (/learn runs one now)."
)


async def before_fold(
    service: MemoryService | None,
    deps: FoldDeps,
    conversation_id: int,
    row_ids: Sequence[int],
    reason: str,
    window: int | None = None,
) -> str | None:
    """The compaction pass over the rows about to be folded away: one call, suggestions only.
    Not for a manual /compact (the user is there and can /learn), never when ephemeral.
    What the person is told when the pass did not run (FOLD_PASS_FAILED), else None."""
    if service is None or reason == "manual" or not row_ids:
        return None
    from heron.memory.extract import compaction_pass, window_room

    asker = _DepsProvider(deps)
    by_window = window_room(asker, window)

    def room(system: str) -> int:  # the check's room, never past what the window leaves
        return min(asker.room(system), by_window(system))

    try:
        await compaction_pass(asker, service, conversation_id, row_ids, window, room)
    except Exception as e:  # the pass is a bonus: it never stops a compaction
        asker.failed = str(e) or type(e).__name__
    if asker.failed is None:
        return None
    log.warning("memory pass at compaction failed: %s", asker.failed)
    why = " ".join(asker.failed.splitlines()[0].split())
    return FOLD_PASS_FAILED.format(n=len(row_ids), why=why[:200])


# ---- recall ----------------------------------------------------------------------------------


class LazyEmbedder:
    """The sentence model, loaded on the first semantic search (seconds with torch), not when
    the engine opens."""

    def __init__(self) -> None:
        from heron.memory.vectors import MODEL_NAME

        self.name = MODEL_NAME
        self._model: Any = None
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        with self._lock:
            if self._model is None:
                from heron.memory.vectors import default_embedder

                started = time.monotonic()
                self._model = default_embedder()
                log.info("embedding model loaded in %.1fs", time.monotonic() - started)
        if self._model is None:
            raise RuntimeError("the embedding model is not available")
        return [list(map(float, v)) for v in self._model.encode(texts)]


def lazy_recall(store: Store, zone: str | None = None) -> Recall:
    """Recall with the semantic half when the extra is installed (and HERON_EMBEDDINGS is not
    0); the check is a file lookup, the model itself loads on first use. Its dates are in the
    agent's `zone` (None: the system's)."""
    from heron.memory import vectors

    on = os.environ.get("HERON_EMBEDDINGS", "1") != "0" and vectors.available()
    return Recall(store, LazyEmbedder() if on else None, zone)
