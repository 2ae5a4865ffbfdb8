"""The model-facing view, derived from the full record and never stored in place of it.

From the branch's rows and the compaction metadata: the rows folded by the latest consolidation
are left out (their summary is in the system prompt), rows folded by an in-flight compaction are
left out and the row that carries its checkpoint gets it appended, old results of read-like
tools become one-line placeholders (ten at a time, so the cached prefix breaks once per ten
results), results over the per-result budget are cut to their head and end around a saved path
(heron/saved.py `cut_middle`: a tool says how it ended in its last lines), a user
message over its share is shown by head and tail (heron/context/long_message.py), and the view
is repaired so it never holds a call without its result or a result without its call.

Everything here is a pure function of its inputs (apart from saving a cut result or message to
disk under a name fixed by its content, heron/saved.py, and reading an attached file's bytes),
so the same record always gives the same bytes: that is what lets request N+1 start with
request N.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from heron.context.long_message import FileReader, shown
from heron.context.repair import repair_tool_pairs
from heron.context.tokens import Calibration, estimate_message, estimate_text
from heron.messages import Message, Part, Text, ToolCall, ToolResult
from heron.saved import READ_ON, RESULTS_DIR, Cut, cut_middle, earlier_cut, keep
from heron.store.records import ANSWERED, ASK_TOOL, StoredMessage

# Tools whose old results can be dropped from the view: reading them again is possible or
# pointless. run_cell and bash also act, so their placeholder says not to run them again.
COMPACTABLE = frozenset(
    {"read_file", "grep", "list_files", "glob", "run_cell", "bash", "web_fetch", "recall"}
)
EXECUTING = frozenset({"run_cell", "bash"})
KEEP_MIN = 5  # the most recent results always intact: between KEEP_MIN and KEEP_MIN + BATCH - 1
BATCH = 10
_SAVED = re.compile(r"saved in (\S+?\.txt)")
EARLIER = "[Earlier conversation: see the archived context summary in the system prompt.]"
# A view must open with the user's side; one that opens with Heron's own lookup (auto-recall's
# call before an edited first message) has no earlier conversation to point to.
OPENING = "[The conversation starts here.]"


@dataclass(frozen=True)
class ViewPlan:
    """What the compaction records say about a branch."""

    folded_upto: int | None = None  # last row id folded by the active consolidation
    compacted: frozenset[int] = frozenset()  # rows folded by in-flight compactions
    checkpoints: dict[int, str] = field(default_factory=dict)  # anchor row id -> checkpoint


@dataclass(frozen=True)
class ViewOptions:
    result_chars: int = 20_000  # per-result budget in the view
    workspace: Path | None = None  # where a cut result is saved; None: not saved
    user_chars: int | None = None  # per user message; None: unbounded
    recall_chars: int | None = None  # per recall_history result; None: result_chars
    # The bytes of an attachment by its sha256 (the store's): an attached text file over the
    # user message's share is shown by its head and tail (heron/context/long_message.py).
    read_file: FileReader | None = None


def placeholder_count(compactable: int) -> int:
    """How many of the oldest compactable results become placeholders: a multiple of BATCH that
    leaves between KEEP_MIN and KEEP_MIN + BATCH - 1 intact."""
    return max(0, (compactable - KEEP_MIN) // BATCH) * BATCH


Key = tuple[object, int]  # (row id, or ("x", i) for a message not read from the store; part)
Item = tuple[object, Message]


def results_with_calls(items: Sequence[Item]) -> dict[Key, ToolCall | None]:
    """Each result's position and the call it answers, paired with the assistant message just
    before it: some servers reuse call ids (call_0 in every reply), so ids alone are not keys."""
    pending: dict[str, ToolCall] = {}
    out: dict[Key, ToolCall | None] = {}
    for ident, message in items:
        if message.role == "assistant":
            pending = {c.id: c for c in message.tool_calls}
            continue
        for j, part in enumerate(message.parts):
            if isinstance(part, ToolResult):
                out[(ident, j)] = pending.get(part.call_id)
    return out


def old_results(pairs: dict[Key, ToolCall | None]) -> set[Key]:
    """The results to replace by placeholders, counted over the whole record."""
    keys = [k for k, call in pairs.items() if call is not None and call.name in COMPACTABLE]
    return set(keys[: placeholder_count(len(keys))])


def _brief_args(call: ToolCall) -> str:
    for key in ("path", "pattern", "command", "code", "url", "query"):
        value = call.args.get(key)
        if isinstance(value, str):
            one = " ".join(value.split())
            return f'{key}="{one[:60]}{"…" if len(one) > 60 else ""}"'
    return ""


def _saved_path(call_id: str, content: str, workspace: Path | None) -> str | None:
    """Where the whole of `content` is: the file a cut result already names (at its end, as
    the registry's cuts did, or on its cut's line), else a new one."""
    found = _SAVED.search(content[-400:])
    if found:
        return found.group(1)
    earlier = earlier_cut(content)
    if earlier is not None and earlier.saved is not None:
        return earlier.saved
    return keep(call_id, content, workspace, RESULTS_DIR)


def placeholder(call: ToolCall, result: ToolResult, workspace: Path | None) -> ToolResult:
    path = _saved_path(call.id, result.content, workspace) if len(result.content) > 200 else None
    head = f"[Old result of {call.name}({_brief_args(call)}) cleared from the context."
    where = f" Full text saved in {path}." if path else ""
    if call.name in EXECUTING:
        tail = " Do not run the call again just to see its output; it already ran.]"
    else:
        tail = " Read it again if you need it.]" if not path else "]"
    short = result.content if len(result.content) <= 200 else head + where + tail
    return ToolResult(result.call_id, short, result.is_error)


def budgeted(result: ToolResult, limit: int, workspace: Path | None) -> ToolResult:
    """`result` within `limit` characters: its head and its end (a command's exit code and
    error, a traceback, read_file's paging footer are its last lines), one line saying how
    much of the original was left out and where all of it is. A pure function of the result
    and the limit (the file is named by its content): every later request sends the same."""
    cut = cut_middle(result.content, limit)
    if cut is None:
        return result
    return ToolResult(
        result.call_id, cut.text(_kept_where(result, cut, workspace)), result.is_error
    )


def _kept_where(result: ToolResult, cut: Cut, workspace: Path | None) -> str:
    """The sentence of a view's cut that says where the rest is."""
    if cut.saved is not None:  # the registry's cut saved the whole of it already
        return f" The full result is saved in {cut.saved}; {READ_ON}."
    path = keep(result.call_id, result.content, workspace, RESULTS_DIR)
    if path is None:
        return ""
    if cut.total > len(result.content):  # the tool cut it first, and only that is at hand
        return f" What the tool returned ({len(result.content):,} characters) is saved in {path}."
    return f" The full result is saved in {path}; {READ_ON}."


def shape(
    items: Sequence[Item], pairs: dict[Key, ToolCall | None], opts: ViewOptions
) -> list[Message]:
    """Micro-compaction and the per-result and per-message budgets over (key, message) items."""
    old = old_results(pairs)
    out = []
    for ident, message in items:
        row_id = ident if isinstance(ident, int) else None
        message = shown(message, opts.user_chars, opts.workspace, opts.read_file, row_id)
        if not message.tool_results:
            out.append(message)
            continue
        parts: list[Part] = []
        for j, part in enumerate(message.parts):
            call = pairs.get((ident, j))
            if isinstance(part, ToolResult) and (ident, j) in old and call is not None:
                part = placeholder(call, part, opts.workspace)
            elif isinstance(part, ToolResult):
                recall = call is not None and call.name == "recall_history"
                limit = opts.recall_chars if recall and opts.recall_chars else opts.result_chars
                part = budgeted(part, limit, opts.workspace)
            parts.append(part)
        out.append(Message(message.role, parts))
    return out


def shape_messages(messages: Sequence[Message], opts: ViewOptions) -> list[Message]:
    items: list[Item] = [(("x", i), m) for i, m in enumerate(messages)]
    return shape(items, results_with_calls(items), opts)


def _after_fold(rows: Sequence[StoredMessage], plan: ViewPlan) -> Sequence[StoredMessage]:
    """The rows after the active consolidation's cut (all of them when there is none)."""
    ids = [r.id for r in rows]
    return rows[ids.index(plan.folded_upto) + 1 :] if plan.folded_upto in ids else rows


def visible_rows(rows: Sequence[StoredMessage], plan: ViewPlan) -> list[Item]:
    """The wire messages of the rows the view shows, checkpoints appended to their anchors."""
    out: list[Item] = []
    for row in _after_fold(rows, plan):
        if row.id in plan.compacted:
            continue
        message = row.wire
        checkpoint = plan.checkpoints.get(row.id)
        if checkpoint:
            message = Message(message.role, [*message.parts, Text(checkpoint)])
        out.append((row.id, message))
    return out


def not_shown_whole(
    rows: Sequence[StoredMessage], plan: ViewPlan, view: Sequence[Message]
) -> set[int]:
    """The rows after the fold that `view` does not show whole: snipped (left as a pointer or
    a range), folded in flight, a message cut to its head and tail, a result cut or replaced.

    The view is built from the rows' own parts and rebuilds only what it changes, so a row is
    whole when every part of it is one of the view's parts (a checkpoint or snip note added
    around them takes nothing away)."""
    sent = {id(part) for message in view for part in message.parts}
    return {
        row.id
        for row in _after_fold(rows, plan)
        if not all(id(part) in sent for part in row.wire.parts)
    }


def derive_view(
    rows: Sequence[StoredMessage],
    plan: ViewPlan,
    opts: ViewOptions = ViewOptions(),
    extra: Sequence[Message] = (),
) -> list[Message]:
    """What the model sees of a branch (and of `extra`, messages of the running turn not read
    back from the store): never an orphaned call or result, first message user."""
    extra_items: list[Item] = [(("x", i), m) for i, m in enumerate(extra)]
    # Results are counted from the consolidation cut on (rows folded in flight included):
    # the cut breaks the cached prefix anyway, so the count may restart there, while an
    # in-flight fold must not turn placeholders back into results.
    after = _after_fold(rows, plan)
    pairs = results_with_calls([*((r.id, r.message) for r in after), *extra_items])
    view = repair_tool_pairs(shape([*visible_rows(rows, plan), *extra_items], pairs, opts))
    if view and view[0].role == "assistant":
        folded = plan.folded_upto is not None  # only then is there an archived summary
        view.insert(0, Message("user", [Text(EARLIER if folded else OPENING)]))
    return view


def is_clean_user(message: Message) -> bool:
    """A user message that starts a turn: no results, so cutting before it orphans nothing."""
    return message.role == "user" and not message.tool_results


def _is_recall_pair(call: Message, result: Message) -> bool:
    """Auto-recall's synthetic pair (heron/memory/auto.py `auto_messages`; its rows carry meta
    `recall` in the record): recall_history calls alone, then their results alone."""
    calls = [p for p in call.parts if isinstance(p, ToolCall)]
    results = [p for p in result.parts if isinstance(p, ToolResult)]
    return (
        call.role == "assistant"
        and bool(calls)
        and len(calls) == len(call.parts)
        and all(c.name == "recall_history" for c in calls)
        and result.role == "user"
        and len(results) == len(result.parts)
        and {r.call_id for r in results} == {c.id for c in calls}
    )


def turn_starts(messages: Sequence[Message], first: int = 0) -> list[int]:
    """The index where each turn of `messages[first:]` but the first starts (the places a cut
    can go): its clean user message, or the auto-recall pair stored just before that message.
    The pair is the turn's evidence, found for that message: a cut (a fold, a snip) between
    them showed the model the question without it."""
    out = []
    for i in range(first + 1, len(messages)):
        if not is_clean_user(messages[i]):
            continue
        paired = i - 2 >= first and _is_recall_pair(messages[i - 2], messages[i - 1])
        if not paired or i - 2 > first:
            out.append(i - 2 if paired else i)
    return out


def user_texts(message: Message) -> list[str]:
    """What a user row says in the user's own words (results and runtime blocks left out)."""
    from heron.context.runtime import is_runtime_part

    if message.role != "user":
        return []
    return [p.text for p in message.parts if isinstance(p, Text) and not is_runtime_part(p)]


ANSWER_MARK = "(answer to ask_user) "


def person_words(messages: Sequence[Message]) -> list[tuple[int, str]]:
    """(index in `messages`, text) of what the person wrote, in order: the text of user messages
    and each answer typed to `ask_user`, marked as one (only a result of an ask_user call of
    the assistant message just before: no other tool's output can pass for the person's).
    Who wrote a user row is the caller's to tell: Heron's own prompts are user-role too."""
    out: list[tuple[int, str]] = []
    asked: set[str] = set()
    for i, message in enumerate(messages):
        if message.role == "assistant":
            asked = {c.id for c in message.tool_calls if c.name == ASK_TOOL}
            continue
        out.extend((i, text) for text in _said(message, asked))
    return out


def _said(message: Message, asked: set[str]) -> list[str]:
    from heron.context.runtime import is_runtime_part

    said = []
    for part in message.parts:
        if isinstance(part, Text) and not is_runtime_part(part):
            said.append(part.text)
        elif isinstance(part, ToolResult) and part.call_id in asked and _answer(part):
            said.append(ANSWER_MARK + part.content[len(ANSWERED) :])
    return said


def _answer(result: ToolResult) -> bool:
    return not result.is_error and result.content.startswith(ANSWERED)


@dataclass(frozen=True)
class Said:
    """A text of a view's user side as the record holds it: its row, and whether the person
    wrote it (False for Heron's own user-role rows: goal nudges, reminders, subagent results,
    checkpoints)."""

    row_id: int
    text: str
    person: bool


def said_in(rows: Sequence[StoredMessage], plan: ViewPlan) -> list[Said]:
    """What the user side of the rows the view shows says, in order, each with its row and
    author: what snip needs to quote the person's words, each pointing at its own row."""
    shown = [r for r in _after_fold(rows, plan) if r.id not in plan.compacted]
    words = person_words([r.wire for r in shown])
    out = [Said(shown[i].id, text, shown[i].author != "heron") for i, text in words]
    anchors = {r.id for r in shown}  # a checkpoint is appended to its anchor: Heron's text
    return out + [Said(a, text, False) for a, text in plan.checkpoints.items() if a in anchors]


Quote = tuple[int | None, str]  # (row id when known, what the user wrote)
POINTER_WORDS = 8


def pointer(row_id: int | None, text: str) -> str:
    """A user message reduced to its row id and first words: recall_history opens it whole."""
    words = text.split()
    first = " ".join(words[:POINTER_WORDS])[:80]
    more = "…" if len(words) > POINTER_WORDS or len(first) < len(" ".join(words)) else ""
    return f"[#{row_id}] {first}{more}" if row_id is not None else f"- {first}{more}"


VERBATIM_HEAD = "Verbatim, the newest:"  # bounded_quotes' line before the verbatim quotes


def bounded_quotes(quotes: Sequence[Quote], verbatim: int, pointers: int) -> str:
    """The user's messages, newest first: verbatim while `verbatim` tokens last, then each
    reduced to a pointer while `pointers` tokens last, then the rest as one range of row ids.
    Shown oldest first. Nothing is dropped from the record: every pointer opens it."""
    whole: list[str] = []
    short: list[str] = []
    rest: list[Quote] = []
    for rid, text in reversed(quotes):
        line = f"[#{rid}] {text}" if rid is not None else f"> {text}"
        cost = estimate_text(line) + 1
        if not short and not rest and cost <= verbatim:
            whole.append(line)
            verbatim -= cost
            continue
        line = pointer(rid, text)
        cost = estimate_text(line) + 1
        if not rest and cost <= pointers:
            short.append(line)
            pointers -= cost
            continue
        rest.append((rid, text))
    out = []
    if rest:
        ids = [rid for rid, _ in rest if rid is not None]
        span = f"[#{min(ids)}–#{max(ids)}] " if ids else ""
        out.append(
            f"{span}{len(rest)} older messages of the user, not listed"
            + (": recall_history(message_id=N) opens any of them." if ids else ".")
        )
    if short:
        out.append("Older ones by their first words (recall_history(message_id=N) opens one):")
        out.extend(reversed(short))
    if whole and (short or rest):
        out.append(VERBATIM_HEAD)
    out.extend(reversed(whole))
    return "\n".join(out)


_MARKED = re.compile(r"It is message \[#(\d+)\] for recall_history\.")


def _marked_id(text: str) -> int | None:
    """The row id a large message's view names (large_user_text), if it does."""
    found = _MARKED.search(text)
    return int(found.group(1)) if found else None


def _dropped_quotes(messages: Sequence[Message], record: Sequence[Said]) -> list[Quote]:
    """What the person wrote in `messages` (the view's oldest), each with its own row id: the
    record's texts are matched in order, so a text typed twice points at each of its rows.
    Heron's own texts are left out; a text the record does not hold (a message of the running
    turn) is kept, with the id a large message's view names, if any."""
    queues: dict[str, deque[Said]] = {}
    for said in record:
        queues.setdefault(said.text, deque()).append(said)
    out: list[Quote] = []
    for _, text in person_words(messages):
        if not text.strip() or text in (EARLIER, OPENING):
            continue
        queue = queues.get(text)
        if not queue:
            out.append((_marked_id(text), text))
            continue
        said = queue.popleft()
        if said.person:
            out.append((said.row_id, text))
    return out


def snip(
    messages: list[Message],
    budget: int,
    cal: Calibration,
    raws: Sequence[int] | None = None,
    record: Sequence[Said] = (),
    words: int | None = None,
) -> list[Message]:
    """The last resort when the view still exceeds `budget` tokens: drop the oldest turns at a
    clean user boundary, keeping what the person wrote in them (their messages and answers to
    ask_user, not Heron's own user-role prompts), newest first, verbatim while `words` tokens
    last (default a tenth of the budget), then as pointers (`record`: the view's user-side
    texts with their rows and authors, `said_in`). `raws`: each message's raw estimate, when
    the caller already has them."""
    raws = [estimate_message(m) for m in messages] if raws is None else raws
    sizes = [cal.tokens(r) for r in raws]
    if sum(sizes) <= budget:
        return messages
    starts = turn_starts(messages)
    if not starts:
        return messages
    words = budget // 10 if words is None else words
    room = words + budget // 20 + 80  # the note's own size: quotes, pointers, its sentences
    total, cut = sum(sizes), starts[-1]
    for i in starts:
        if total - sum(sizes[:i]) + room <= budget:
            cut = i
            break
    dropped = _dropped_quotes(messages[:cut], record)
    note = f"[{cut} earlier messages left out of this view to fit the context window."
    if dropped:
        quoted = bounded_quotes(dropped, words, budget // 20)
        note += " What the user wrote in them:\n" + quoted
    first = messages[cut]
    if first.role != "user":  # the turn opens with its auto-recall pair: the note goes first
        return [Message("user", [Text(note + "]")]), *messages[cut:]]
    return [Message("user", [Text(note + "]\n\n"), *first.parts]), *messages[cut + 1 :]]
