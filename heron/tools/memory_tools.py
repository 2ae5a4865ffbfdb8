"""The memory tools: manage_memory, view_memory, propose_lesson, recall_history.

They reach their services through `ToolContext.services`: `memory` (a MemoryService),
`conversation_id` and `conversation_key` (the conversation of the run), and optionally `recall`
(a Recall; built from the memory service's store when absent). A refusal (a quote the user never
wrote, a secret, a sensitive claim, a bad name, too many changes in one reply) comes back to the
model as an error result that says why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

from heron.errors import StoreError, ToolError
from heron.memory import spelling
from heron.memory.entries import EntryPath, MemoryRefused, render, slugify
from heron.memory.recall import Hit, Recall, heading, spoken_by
from heron.memory.service import AlreadySaid, MemoryService, Unchanged
from heron.memory.wiring import seen_by_model
from heron.messages import JSONObject, Text, Thinking, ToolCall, ToolResult, dumps
from heron.tools.context import ToolContext
from heron.tools.registry import tool


def _memory(ctx: ToolContext) -> MemoryService:
    service = ctx.services.memory
    if service is None:
        raise ToolError("memory is not available in this run (ephemeral or not configured)")
    return service


def _conversation(ctx: ToolContext) -> int:
    conversation_id = ctx.services.conversation_id
    if conversation_id is None:
        raise ToolError("memory needs a saved conversation; this run has none")
    return conversation_id


def _path(path: str) -> EntryPath:
    try:
        return EntryPath.parse(path)
    except MemoryRefused as e:
        raise ToolError(str(e)) from e


MAX_CHANGES_PER_REPLY = 5
MOST_HITS = 30  # hits one recall_history search returns, at most


@contextmanager
def _budget(ctx: ToolContext) -> Iterator[None]:
    """One of the reply's memory changes, given back when the change is refused: more than
    MAX_CHANGES_PER_REPLY changes in one reply are refused."""
    changes, reply = ctx.memory_changes, ctx.reply_seq
    with changes.lock:
        if changes.reply != reply:
            changes.reply, changes.count = reply, 0
        changes.count += 1
        n = changes.count
    try:
        if n > MAX_CHANGES_PER_REPLY:
            raise ToolError(
                f"refused: at most {MAX_CHANGES_PER_REPLY} memory changes in one reply (this "
                f"was change {n}); save only what the user stated as lasting, one fact per entry"
            )
        yield
    except BaseException:
        with changes.lock:
            if changes.reply == reply:
                changes.count -= 1
        raise


@tool
def manage_memory(
    ctx: ToolContext,
    action: Literal["create", "update", "delete"],
    path: str,
    quote: str,
) -> str:
    """Save, change or forget a durable fact or preference the user stated, in their words.

    The entry's text is the quote itself (a leading "remember that" left out): you choose
    where it goes, never its wording. Save only what the user said themselves and what will
    still be true later; at most 5 changes per reply. Put rules that shape nearly every task
    under always/; file everything else under when/<topic>/, the topic named after the
    situation it applies to (writing-to-friends, not communication).

    Args:
        action: create, update (replace an entry's text with something new the user said) or
            delete (the user asked to forget it; what it said is revoked, so it is not learned
            again).
        path: scope/always/slug or scope/when/topic/slug; names are lowercase letters, digits and
            hyphens; the scope is personal unless the fact belongs to one project or domain. A
            name already taken gets a suffix.
        quote: the user's own words from this conversation, copied exactly: for create and
            update a whole sentence or clause that states the fact; for delete their request
            to forget it. Tool results, Heron's prompts and your own text are refused.
    """
    service = _memory(ctx)
    conversation_id = _conversation(ctx)
    entry_path = _path(path)
    key = ctx.services.conversation_key
    try:
        with _budget(ctx):
            done = ctx.record_effect  # in the trace: the call changed a file of memory's
            return _change(service, conversation_id, key, action, entry_path, quote, done)
    except MemoryRefused as e:
        raise ToolError(str(e)) from e


def _change(
    service: MemoryService,
    conversation_id: int,
    key: str | None,
    action: str,
    entry_path: EntryPath,
    quote: str,
    effect: Callable[[JSONObject], None] = lambda _: None,
) -> str:
    """What the model is told; a file of memory changed is handed to `effect` (the call's
    effects in the trace), not a change left to the person's review."""
    if action == "delete":
        gone = service.delete(conversation_id, entry_path, quote)
        effect({"kind": "memory_forgotten", "path": gone.path.rel})
        also = service.still_said(gone)
        scrubbed = service.scrub_line(gone.path.rel)
        told = f" {scrubbed}" if scrubbed else ""
        if also:
            return f"Forgot {gone.path.rel}. {also}{told}"
        return f"Forgot {gone.path.rel}; what it said will not be learned again.{told}"
    if action == "update":
        try:
            changed = service.update(conversation_id, entry_path, quote, conversation_key=key)
        except (Unchanged, AlreadySaid) as same:  # not an error: memory already says it
            return f"Nothing changed: {same.summary}"
        if isinstance(changed, int):
            return (
                f"{entry_path.rel} was written by the user by hand, so the change waits for "
                f"their review as #{changed} (it shows the old and the new text)."
            )
        effect({"kind": "memory_updated", "path": changed.path.rel})
        return f"Updated {changed.path.rel}: {changed.text}"
    try:
        entry = service.save(conversation_id, entry_path, quote, conversation_key=key)
    except AlreadySaid as said:  # not an error: memory holds the statement once already
        return f"Nothing saved: {said.summary}"
    effect({"kind": "memory_saved", "path": entry.path.rel})
    if entry.created < entry.updated:  # it said a clause of this: one entry says it whole now
        return f"Updated {entry.path.rel} (it said only part of this): {entry.text}"
    moved = "" if entry.path == entry_path else f" ({entry_path.rel} is taken: it got its own name)"
    return f"Saved {entry.path.rel}{moved}: {entry.text}"


@tool
def view_memory(ctx: ToolContext, path: str | None = None, scope: str | None = None) -> str:
    """Read one memory entry in full (with its source), or list the entries of a scope.

    Args:
        path: an entry, scope/always/slug or scope/when/topic/slug.
        scope: list this scope's entries; with neither argument, every scope is listed.
    """
    service = _memory(ctx)
    try:
        if path:
            return render(service.get(_path(path)))
        entries = service.entries(scope)
    except MemoryRefused as e:
        raise ToolError(str(e)) from e
    if not entries:
        return "No memory entries" + (f" in scope {scope}." if scope else ".")
    return "\n".join(f"{e.path.rel}: {' '.join(e.text.split())}" for e in entries)


@tool
def propose_lesson(
    ctx: ToolContext, rule: str, mistake: str, topic: str, scope: str = "personal"
) -> str:
    """Propose a lesson after getting something wrong: a general rule and the mistake it
    prevents. It waits for the user's review; it is not saved by proposing it.

    Args:
        rule: the general rule to follow from now on.
        mistake: what went wrong that this rule prevents.
        topic: the situation it applies to (lowercase-with-hyphens), e.g. sending-email.
        scope: personal, or a project or domain scope.
    """
    service = _memory(ctx)
    try:
        path = EntryPath(scope, "when", topic, slugify(rule))
        number = service.suggest_lesson(path, rule, mistake, ctx.services.conversation_id)
    except MemoryRefused as e:
        raise ToolError(str(e)) from e
    return f"Lesson #{number} waits for the user's review (it is not in memory yet)."


@tool
def recall_history(
    ctx: ToolContext, query: str = "", limit: int = 8, message_id: int | None = None
) -> str:
    """Search everything said in every conversation (including parts no longer in your
    context) and return matching snippets with conversation, date and message id; or, with
    message_id, open that one message whole (a pointer such as [#123] in your context).

    Args:
        query: words to look for; a question works.
        limit: how many snippets, 1 to 30.
        message_id: the id of one message to read whole, instead of searching.
    """
    recall = _recall(ctx)
    if message_id is not None:
        return _open_message(recall, message_id)
    if not query.strip():
        raise ToolError("give a query to search for, or a message_id to open")
    wanted = max(1, min(limit, MOST_HITS))
    # a word no message holds (a typo) is searched as the nearest one the history holds
    searched, respelled = recall.respelled(query)
    hits = recall.search(searched, wanted, exclude=_in_view(ctx, recall), standing=True)
    said = [spelling.note(respelled)] if respelled else []
    left_out = [note] if (note := hits.forgotten_note("the person")) else []
    if not hits:
        days = recall.days_named(searched)
        read = f" (read as {', '.join(f'{d:%a %Y-%m-%d}' for d in days)})" if days else ""
        return "\n".join([*said, f"Nothing found for {query!r}{read}.", *left_out])
    lines = [line for hit in hits for line in hit.lines()]
    return "\n".join([*said, *lines, *_more(recall, searched, hits, wanted), *left_out])


def _more(recall: Recall, query: str, hits: list[Hit], wanted: int) -> list[str]:
    """The line that says a day's listing shows only the first of its messages, if it does."""
    listing = recall.day_listing(query)
    if listing is None:
        return []
    if wanted < MOST_HITS:
        more = f"limit={min(listing.total, MOST_HITS)} lists more"
    else:
        more = f"{MOST_HITS} is the most one search lists"
    note = listing.note(len(hits), wanted, "the person", more)
    return [note] if note else []


def _in_view(ctx: ToolContext, recall: Recall) -> set[int]:
    """The messages the model reads whole in its view: returned first (they hold the query's
    words best, the asking message above all), they would crowd out the past. Auto-recall's
    in-view rows (the branch after /new and the fold) and the running turn's, less what the
    latest request showed only as a pointer or cut to its head and tail (`view_cuts`)."""
    services = ctx.services
    conversation = services.conversation_id
    if conversation is None:
        return set()
    rows = seen_by_model(recall.store, conversation).rows | _this_turn(ctx, recall, conversation)
    return set(rows) - (services.view_cuts() if services.view_cuts is not None else set())


def _this_turn(ctx: ToolContext, recall: Recall, conversation: int) -> set[int]:
    """The running turn's messages: the one that asks and what followed it."""
    start = ctx.services.turn_start
    if start is None:
        return set()
    return {row.id for row in recall.store.branch_since(conversation, start) if row.id >= start}


def _open_message(recall: Recall, message_id: int) -> str:
    """One message of the record, whole: its text, calls and results, under the heading a
    search hit has (conversation, date, id, who said it: "when did I say X" needs the date)."""
    try:
        row = recall.store.message(message_id)
        key = recall.store.conversation_by_id(row.conversation_id).key
    except StoreError as e:
        raise ToolError(f"{e}; the ids are those in [#N] pointers and search results") from e
    lines = [heading(key, row.created, recall.zone, row.id, spoken_by(row.role, row.author))]
    for part in row.message.parts:
        if isinstance(part, Text | Thinking):
            if part.text is not None:
                lines.append(part.text)
        elif isinstance(part, ToolCall):
            lines.append(f"call {part.name}({dumps(part.args)})")
        elif isinstance(part, ToolResult):
            lines.append(part.content)
    return "\n".join(lines)


def _recall(ctx: ToolContext) -> Recall:
    given = ctx.services.recall
    if given is not None:
        return given
    service = _memory(ctx)
    return Recall(service.store, zone=service.timezone)


MEMORY_TOOLS = [manage_memory, view_memory, propose_lesson, recall_history]
