"""The memory tools: manage_memory, view_memory, propose_lesson, recall_history.

They reach their services through `ToolContext.extra`: "memory" (a MemoryService),
"conversation_id" and "conversation_key" (the conversation of the run), and optionally "recall"
(a Recall; built from the memory service's store when absent). A refusal (a quote the user never
wrote, a secret, a bad name) comes back to the model as an error result that says why.
"""

from __future__ import annotations

from typing import Any, Literal

from heron.errors import StoreError, ToolError
from heron.memory.entries import EntryPath, MemoryRefused, render, slugify
from heron.memory.recall import Recall
from heron.memory.service import MemoryService
from heron.messages import ToolCall, ToolResult, dumps
from heron.tools.registry import ToolContext, tool


def _memory(ctx: ToolContext) -> MemoryService:
    service = ctx.extra.get("memory")
    if not isinstance(service, MemoryService):
        raise ToolError("memory is not available in this run (ephemeral or not configured)")
    return service


def _conversation(ctx: ToolContext) -> int:
    conversation_id = ctx.extra.get("conversation_id")
    if not isinstance(conversation_id, int):
        raise ToolError("memory needs a saved conversation; this run has none")
    return conversation_id


def _path(path: str) -> EntryPath:
    try:
        return EntryPath.parse(path)
    except MemoryRefused as e:
        raise ToolError(str(e)) from e


@tool
def manage_memory(
    ctx: ToolContext,
    action: Literal["create", "update", "delete"],
    path: str,
    quote: str,
    text: str | None = None,
) -> str:
    """Save, change or forget a durable fact or preference the user stated.

    Save only what the user said themselves and what will still be true later. Put rules that
    shape nearly every task under always/; file everything else under when/<topic>/, the topic
    named after the situation it applies to (writing-to-friends, not communication).

    Args:
        action: create, update (replace the text of an existing entry) or delete (the user asked
            to forget it; its source is revoked so it is not learned again).
        path: scope/always/slug or scope/when/topic/slug; names are lowercase letters, digits and
            hyphens; the scope is personal unless the fact belongs to one project or domain.
        quote: the user's own words from this conversation, copied exactly, that state the fact
            (for delete: their request to forget it). Tool results and your own text are refused.
        text: the rule or fact as it should be applied, in one or two sentences (create, update).
    """
    service = _memory(ctx)
    conversation_id = _conversation(ctx)
    entry_path = _path(path)
    try:
        if action == "delete":
            service.verify_quote(conversation_id, quote)
            gone = service.forget(entry_path, conversation_id)
            return f"Forgot {gone.path.rel}; its source will not be learned again."
        exists = service.files.read(entry_path) is not None
        if action == "create" and exists:
            raise ToolError(f"{entry_path.rel} exists; use action=update, or another slug")
        if action == "update" and not exists:
            raise ToolError(f"{entry_path.rel} does not exist; use action=create")
        if not text:
            raise ToolError("text is required to create or update an entry")
        key = ctx.extra.get("conversation_key")
        entry = service.save(conversation_id, entry_path, text, quote, conversation_key=key)
    except MemoryRefused as e:
        raise ToolError(str(e)) from e
    verb = "Saved" if action == "create" else "Updated"
    return f"{verb} {entry.path.rel}: {entry.text}"


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
        number = service.suggest_lesson(path, rule, mistake, ctx.extra.get("conversation_id"))
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
    hits = recall.search(query, max(1, min(limit, 30)))
    if not hits:
        return f"Nothing found for {query!r}."
    return "\n".join(hit.line() for hit in hits)


def _open_message(recall: Recall, message_id: int) -> str:
    """One message of the record, whole: its text, calls and results."""
    try:
        row = recall.store.message(message_id)
    except StoreError as e:
        raise ToolError(f"{e}; the ids are those in [#N] pointers and search results") from e
    lines = [f"[message {row.id} · {row.role}]"]
    for part in row.message.parts:
        text = getattr(part, "text", None)
        if isinstance(text, str):
            lines.append(text)
        elif isinstance(part, ToolCall):
            lines.append(f"call {part.name}({dumps(part.args)})")
        elif isinstance(part, ToolResult):
            lines.append(part.content)
    return "\n".join(lines)


def _recall(ctx: ToolContext) -> Recall:
    found: Any = ctx.extra.get("recall")
    if isinstance(found, Recall):
        return found
    return Recall(_memory(ctx).store)


MEMORY_TOOLS = [manage_memory, view_memory, propose_lesson, recall_history]
