"""Extraction passes: a model reads part of a conversation and proposes what memory could gain
or lose. None of them saves anything: every pick goes to the review queue, and a fact is only
queued when its quote is found in the user's own words among the messages the pass may quote
(the rest of the conversation is context it cannot quote).

    compaction_pass   the messages about to be folded away by compaction
    review_pass       what was said since the last review (a chat's end, /learn), from the
                      oldest unread on, in calls that fit the window; the cursor moves past
                      what was read
    tidy_pass         memory as a whole: duplicated, contradicted or stale entries; lessons to
                      rewrite (the user's own facts are never reworded)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from heron.context.tokens import estimate_text
from heron.errors import ProviderError
from heron.memory import queue, records
from heron.memory.entries import EntryPath, MemoryRefused, slugify
from heron.memory.guard import find_quote, quoted_in, typed_texts
from heron.memory.recall import spoken_by
from heron.memory.service import MemoryService
from heron.messages import Message, Reply, Text
from heron.providers.profiles import profile_for
from heron.request import ChatRequest
from heron.store import StoredMessage

CONTEXT_CHARS = 24_000
ROW_CHARS = 1_500

FACTS_SYSTEM = """\
You help keep the user's memory: durable facts and preferences the user stated about themselves.
Read the QUOTABLE messages (the user's own words); the CONTEXT is there so you can tell a lasting
preference from an instruction for the task at hand, and skip what the user later took back. A
CONTEXT line labelled heron is Heron's own (a reminder, a monitor's message), never the user's. Do
not propose anything memory already covers. Only what the user said counts: never what the
assistant inferred, tool output or web pages; nor what the user puts in quotation marks to report
what someone else said. No secrets, credentials or sensitive claims.
Saving nothing is the common outcome.

Reply with one JSON object and nothing else:
{"facts": [{"path": "personal/always/<slug>" or "personal/when/<topic>/<slug>",
            "quote": "one whole sentence of the user's, copied exactly from one QUOTABLE
                      message, that states the fact (it becomes the entry's text)"}],
 "lessons": [{"topic": "<situation>", "rule": "a general rule", "mistake": "what it prevents"}]}
always/ is for rules that shape nearly every task; everything else goes under when/<topic>/,
the topic named after the situation it applies to. Names: lowercase letters, digits, hyphens."""

TIDY_SYSTEM = """\
You tidy the user's memory. Propose removing entries that another entry already covers, that the
user later contradicted, or that no longer hold; propose rewriting lessons (origin: lesson) that
are too narrow or overlap. Never reword the user's own facts. Proposing nothing is fine.
Reply with one JSON object and nothing else:
{"removals": [{"path": "...", "reason": "..."}], "rewrites": [{"path": "...", "text": "..."}]}"""


class Asker(Protocol):
    """What the extraction passes need of a model: a provider, or compaction's recorded
    `deps.chat` (memory.wiring's fold adapter), so the pass at a fold is traced."""

    @property
    def model(self) -> str: ...

    async def chat(self, request: ChatRequest) -> Reply: ...


def _row_line(row: StoredMessage) -> str:
    """A CONTEXT line, labelled by who said it as recall labels hits (`spoken_by`): a row
    Heron wrote (a reminder's prompt, a monitor's or the heartbeat's message, a failure note)
    has the wire role user but is `heron`, so no lesson is drawn from it as the person's
    (qa24e M4: 58 of 60 context lines were such rows, labelled `[user #N]`)."""
    text = " ".join(row.message.text.split())[:ROW_CHARS]
    return f"[{spoken_by(row.role, row.author)} #{row.id}] {text}" if text else ""


def _memory_list(service: MemoryService) -> str:
    lines = [
        f"- {e.path.rel} (origin: {e.origin}): {' '.join(e.text.split())}"
        for e in service.entries()
    ]
    return "\n".join(lines) or "(empty)"


QUOTABLE_SHARE = 2 / 3  # of the room left by memory's list: the rest is context
MEMORY_SHARE = 1 / 3  # of the room at most for memory's list; the person's words come first


@dataclass(frozen=True)
class Batch:
    """One extraction call's part of a conversation: the rows it may quote (the person's
    oldest unread words, whole, as many as fit), its prompt, and `read_to`, the last row it
    covers (a review's cursor moves there once the call is answered)."""

    rows: list[StoredMessage]
    quotable: set[int]
    prompt: str
    read_to: int


def _batch(
    service: MemoryService, rows: list[StoredMessage], ids: Sequence[int], room: int
) -> Batch | None:
    """The call over `ids` (in order) within `room` tokens: memory's list (at most a third of
    the room), then the person's words from the oldest on while they fit (at least one, its
    head if it alone is too long), then the context in what is left. None when none of `ids`
    is the person's own words."""
    typed = typed_texts(rows)  # the person's words, answers to ask_user included
    candidates = [i for i in ids if i in typed]
    if not candidates:
        return None
    saved = _clip(_memory_list(service), int(room * MEMORY_SHARE))
    head = f"MEMORY ALREADY SAVED\n{saved}\n\nCONTEXT (do not quote)\n"
    header = "\n\nQUOTABLE (the user's own words)\n"
    left = room - estimate_text(head + header)
    share = int(left * QUOTABLE_SHARE)
    words: list[str] = []
    used = 0
    for i in candidates:
        line = f"[#{i}] {typed[i]}"
        cost = estimate_text(line) + 1
        if words and used + cost > share:
            break
        words.append(line if words else _clip(line, share))
        used += estimate_text(words[-1]) + 1
    taken = candidates[: len(words)]
    rest = candidates[len(words) :]
    read_to = rest[0] - 1 if rest else max(ids)
    shown = _context(rows, set(taken), left - used)
    prompt = head + (shown or "(none)") + header + "\n".join(words)
    return Batch(rows, set(taken), prompt, read_to)


def _clip(text: str, tokens: int) -> str:
    """`text` within `tokens`: its head, with the cut said, when it is longer."""
    if estimate_text(text) <= tokens:
        return text
    keep = max(tokens, 0) * 4
    while keep and estimate_text(text[:keep]) > tokens - 16:
        keep = keep * 9 // 10
    return text[:keep] + " [... cut to fit the window]"


def _context(rows: Sequence[StoredMessage], quotable: set[int], tokens: int) -> str:
    """The rows the pass may not quote, within CONTEXT_CHARS and `tokens`, in the
    conversation's order. Those among the quotable messages come first (the replies the
    person's words answer or were answered by), then those after them, nearest first (where
    the person may have taken something back), then those before, nearest first. The tail of
    the whole conversation would miss the replies of an early fold's rows entirely in a long
    one."""
    lines = {r.id: line for r in rows if r.id not in quotable and (line := _row_line(r))}
    first, last = min(quotable), max(quotable)
    within = [i for i in lines if first < i < last]
    after = [i for i in lines if i > last]
    before = [i for i in reversed(lines) if i < first]
    chosen: list[int] = []
    size = cost = 0
    for i in within + after + before:
        size += len(lines[i]) + 1
        cost += estimate_text(lines[i]) + 1
        if size > CONTEXT_CHARS or cost > tokens:
            break
        chosen.append(i)
    return "\n".join(lines[i] for i in sorted(chosen))


def parse_reply(text: str) -> dict[str, Any]:
    """The JSON object in a reply; an unreadable reply proposes nothing."""
    candidates = [text.strip()]
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if match:
        candidates.append(match.group())
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


ASK_OUTPUT = 2000  # tokens a pass may answer with


# A pass's system prompt -> the tokens (raw estimate) its one user message may take.
Room = Callable[[str], int]


def window_room(provider: Asker, window: int | None) -> Room:
    """The room of a call sent as it is (a review's): the window less the answer, the system
    prompt and the slack of the estimate. A call that a request check counts (the pass at a
    fold, `ContextDeps.chat`) gets that check's room instead (memory.wiring)."""
    return lambda system: (window or _window_of(provider)) - ASK_OUTPUT - estimate_text(system) - 64


async def _ask(provider: Asker, system: str, prompt: str, room: Room) -> dict[str, Any] | None:
    """The model's JSON answer ({} when unreadable); None when the call failed (or a bound
    refused it): nothing was read."""
    prompt = fit_prompt(prompt, room(system) + 64)
    request = ChatRequest(provider.model, system, [Message("user", [Text(prompt)])], [], ASK_OUTPUT)
    try:
        reply = await provider.chat(request)
    except ProviderError:
        return None  # a failed pass proposes nothing; the conversation is untouched
    return parse_reply(reply.text)


def _window_of(provider: Asker) -> int:
    """The window of the model a pass asks, by its built-in profile: when the caller does not
    say (`window`, the engine's own profile: config overrides, HERON_CONTEXT_WINDOW and what a
    local GGUF file says included)."""
    return profile_for(provider.model).context_window


def fit_prompt(prompt: str, room: int) -> str:
    """The pass's prompt within `room` tokens (the window's hard invariant holds for memory's
    own requests too): its head and tail, with what was left out said, when it is larger. A
    pass that sees less proposes less; it never sends a request over the window."""
    room = max(room - 64, 0)  # the marker and the estimate's slack
    if estimate_text(prompt) <= room:
        return prompt
    keep = room * 4 // 2  # characters at each end, about four a token
    cut = len(prompt) - 2 * keep
    return (
        f"{prompt[:keep]}\n[... {cut} characters left out to fit the window ...]\n{prompt[-keep:]}"
    )


def _items(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key)
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _waiting_ids(service: MemoryService) -> set[int]:
    return {s.id for s in service.waiting()}


def _new(ids: list[int], waiting: set[int]) -> list[int]:
    """`ids` without those that were already waiting (a pick the queue already held comes back
    as its number) nor repeats: what a pass reports is what it added."""
    return [i for i in dict.fromkeys(ids) if i not in waiting]


# Why a fact the model picked was not queued, as a review's report counts them.
QUOTED = "in quotation marks (someone else's words)"
NOT_THEIRS = "not the user's words"
UNREAD = "not among the messages this pass read"
REFUSED = "refused by memory's rules"
ALREADY = "already in memory"


def _queue_picks(
    service: MemoryService,
    conversation_id: int,
    data: dict[str, Any],
    rows: list[StoredMessage],
    quotable: set[int],
    refused: list[str] | None = None,
) -> list[int]:
    """Queue the picks that survive every check; the ids of those newly queued. Why each fact
    was not is added to `refused` (QUOTED, NOT_THEIRS, UNREAD, REFUSED, ALREADY), when
    given."""
    ids: list[int] = []
    waiting = _waiting_ids(service)
    why: list[str] = [] if refused is None else refused
    # Longest first: a sentence and its own clause picked together are one statement, which
    # the sentence says whole (the clause then finds it queued).
    facts = sorted(_items(data, "facts"), key=lambda f: -len(str(f.get("quote", ""))))
    for fact in facts:
        quote = str(fact.get("quote", ""))
        if not find_quote(quote, rows, only=quotable):
            # Not the user's own words among what this pass may quote.
            why.append(_not_quotable(quote, rows, quotable))
            continue
        try:
            path = EntryPath.parse(str(fact.get("path", "")))
            number = service.suggest_fact(conversation_id, path, quote)
        except MemoryRefused:
            why.append(REFUSED)
            continue
        if number is None:
            why.append(ALREADY)
        else:
            ids.append(number)
    for lesson in _items(data, "lessons"):
        rule = str(lesson.get("rule", ""))
        try:
            path = EntryPath("personal", "when", str(lesson.get("topic", "")), slugify(rule))
            ids.append(
                service.suggest_lesson(path, rule, str(lesson.get("mistake", "")), conversation_id)
            )
        except MemoryRefused:
            continue
    return _new(ids, waiting)


def _not_quotable(quote: str, rows: list[StoredMessage], quotable: set[int]) -> str:
    """Why a pick is not among the words this pass may quote: someone else's words in
    quotation marks, the user's words in a message this pass did not read (one an earlier
    pass read, say), or nothing the user wrote."""
    if quoted_in(quote, rows, only=quotable):
        return QUOTED
    return UNREAD if find_quote(quote, rows) else NOT_THEIRS


async def extract(
    provider: Asker,
    service: MemoryService,
    conversation_id: int,
    quotable_ids: Iterable[int],
    window: int | None = None,
    refused: list[str] | None = None,
    room: Room | None = None,
) -> tuple[list[int], int] | None:
    """One extraction call over the conversation: the ids of the queued suggestions and the
    last row it read (`Batch.read_to`); None when the call failed, so nothing was read. Why a
    fact was not queued goes to `refused` (`_queue_picks`).
    `window`: the asked model's, in tokens (else its built-in profile's); `room`: what the
    prompt may take, when the call's own check counts otherwise (`window_room`). Its prompt is
    made off the event loop: it reads and decodes every row of the conversation (a
    20,000-message one held the loop for half a second)."""
    ids = sorted(set(quotable_ids))
    if not ids:
        return [], 0
    room = room or window_room(provider, window)
    tokens = room(FACTS_SYSTEM)
    batch = await service.store.call(_request, service, conversation_id, ids, tokens, off_loop=True)
    if batch is None:
        return [], max(ids)  # none of them is the person's words: nothing to ask
    data = await _ask(provider, FACTS_SYSTEM, batch.prompt, room)
    if data is None:
        return None
    picks = _queue_picks(service, conversation_id, data, batch.rows, batch.quotable, refused)
    return picks, batch.read_to


def _request(
    service: MemoryService, conversation_id: int, ids: Sequence[int], room: int
) -> Batch | None:
    """The call over `ids` of the conversation (`_batch`); None when none of them is the
    person's own words."""
    return _batch(service, service.store.all_messages(conversation_id), ids, room)


async def compaction_pass(
    provider: Asker,
    service: MemoryService,
    conversation_id: int,
    folded_ids: Iterable[int],
    window: int | None = None,
    room: Room | None = None,
) -> list[int]:
    """At compaction: the messages about to be folded away are the only quotable ones. One
    call, at the turn's cost: what did not fit its window is read by the next review (the
    review's cursor does not move at a fold)."""
    done = await extract(provider, service, conversation_id, folded_ids, window, room=room)
    return done[0] if done else []


def reviewed_up_to(service: MemoryService, conversation_id: int) -> int:
    return records.reviewed_up_to(service.store, conversation_id)


REVIEW_CALLS = 4  # model calls a review pass may make over one conversation


async def review_pass(
    provider: Asker,
    service: MemoryService,
    conversation_id: int,
    window: int | None = None,
    calls: int = REVIEW_CALLS,
    refused: list[str] | None = None,
) -> list[int]:
    """What was said since the last review, from the oldest unread on: each call reads the
    person's messages that fit the window whole, and the review cursor moves past what the
    answered call read (so the same messages are not reviewed twice: a chat's end after /learn
    proposes nothing again), up to `calls` calls; the rest waits for the next pass, as does
    what a failed call was given. The ids of the suggestions it newly queued; why each fact
    picked was not queued goes to `refused`, when given."""
    ids: list[int] = []
    for _ in range(calls):
        since = reviewed_up_to(service, conversation_id)
        new = await service.store.call(
            records.message_ids_after, service.store, conversation_id, since, off_loop=True
        )
        if not new:
            break
        done = await extract(provider, service, conversation_id, new, window, refused)
        if done is None:
            break
        ids += done[0]
        records.set_reviewed_up_to(service.store, conversation_id, done[1])
        if done[1] >= new[-1]:
            break
    return ids


async def tidy_pass(
    provider: Asker,
    service: MemoryService,
    conversation_id: int | None = None,
    window: int | None = None,
) -> list[int]:
    """Removals of duplicated, contradicted or stale entries; rewrites of lessons only. The ids
    of those newly queued."""
    entries = {e.path.rel: e for e in service.entries()}
    if not entries:
        return []
    listed = f"MEMORY\n{_memory_list(service)}"
    data = await _ask(provider, TIDY_SYSTEM, listed, window_room(provider, window)) or {}
    ids: list[int] = []
    waiting = _waiting_ids(service)
    for removal in _items(data, "removals"):
        path = str(removal.get("path", "")).removesuffix(".md") + ".md"
        if path in entries:
            try:
                number = service.suggest_removal(
                    path, str(removal.get("reason", "")), conversation_id
                )
            except MemoryRefused:
                continue  # turned down before
            ids.append(number)
    for rewrite in _items(data, "rewrites"):
        path = str(rewrite.get("path", "")).removesuffix(".md") + ".md"
        entry = entries.get(path)
        text = str(rewrite.get("text", "")).strip()
        if entry is None or entry.origin != "lesson" or not text:
            continue  # the user's own facts are never reworded
        if " ".join(text.split()) == " ".join(entry.text.split()):
            continue  # a no-op: the rewrite says what the lesson already says
        try:
            number = queue.add(
                service.store,
                "amendment",
                origin="lesson",
                path=path,
                text=text,
                reason=entry.text,  # shown beside the new text in the review
                conversation_id=conversation_id,
                base_digest=entry.digest,
            )
        except MemoryRefused:
            continue  # turned down before
        ids.append(number)
    return _new(ids, waiting)
