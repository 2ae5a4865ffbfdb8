"""Slash commands: answers that never reach the model.

`parse(text)` recognises a command; anything else, including an unknown `/foo`, is not one and
goes to the model as ordinary text. `run(command, ctx)` returns a `CommandReply`: a text to show,
or a text to run as the turn (`/retry`, `/edit` start a branch), or a conversation to switch to.
The outputs are exact and tested: channels print them as they are.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from heron.agent.control import without_labels
from heron.bus import (
    ALREADY_ANSWERED,
    NOTHING_SINCE_NEW,
    NOTHING_TO_RETRY,
    RETRY_UNANSWERED,
    STOP_ANSWER_CODE,
    stopped_by,
)
from heron.messages import Message, Text, plural
from heron.providers.profiles import file_summary
from heron.store import Conversation, Store, StoredMessage
from heron.store import engine_state as es
from heron.store.records import COMPACT, LEARN

if TYPE_CHECKING:
    from heron.compaction.core import CompactionSetup
    from heron.config import Settings
    from heron.memory.service import MemoryService
    from heron.providers.base import Provider
    from heron.providers.profiles import ModelChoice
    from heron.providers.wire import ModelCallRecord

SEPARATOR = "── new conversation: the model starts fresh from here ──"
RECENT_TURNS = 5

HELP = """\
Commands:
  /new           start afresh: the model forgets this conversation, the transcript stays
  /stop          stop the running turn (what it finished is kept)
  /status        model, conversation, context used, cache hit rate, whether a turn runs
  /resume [KEY]  list conversations, or continue the one named KEY
  /retry         answer your last message again (the old answer stays on its branch)
  /edit N TEXT   replace your message N (see /tree) with TEXT and answer it on a new branch
  /tree [N]      list this conversation's branches, or switch to branch N
  /compact       summarize older messages now to free context
  /memory [review | accept ID | reject ID]   what waits for your review in memory
  /learn         (or /reflect) look for what to remember now; show what memory gained
  /goal [TEXT | done | stop | budget N [TOKENS]]   a goal the agent keeps working on
  /model [NAME]  the model in use; in heron chat, NAME (as --model takes) answers from then on
  /help          this help
Anything else starting with / is sent to the model as it is."""
# /help's last lines while the offline demo answers (only then: a real model needs no pointer).
REAL_MODEL = """\
A real model (not the offline demo): set ANTHROPIC_API_KEY, OPENAI_API_KEY or HERON_BASE_URL
(README, "Pointing Heron at a model"); `heron config show` says which model is in use."""


def help_text(embedded: bool) -> str:
    """/help: the commands, and how to point Heron at a real model while the offline demo
    (`ModelChoice.embedded`) answers."""
    return f"{HELP}\n{REAL_MODEL}" if embedded else HELP


@dataclass(frozen=True)
class Command:
    name: str
    arg: str


@dataclass(frozen=True)
class CommandReply:
    text: str | None = None  # shown to the user; the model is not called
    run_text: str | None = None  # run this as the turn's message (after moving the head)
    # /retry of a message no answer followed (its turn failed): answer this stored row where it
    # is, without storing the text again.
    answer_id: int | None = None
    switch_to: str | None = None  # the channel continues in this conversation
    code: str | None = None  # OutboundMessage.code of the answer
    # The command's maintenance run (/compact, /learn) called the model and every call
    # answered: a chat takes it as a turn answered (its review at exit, heron chat).
    model_answered: bool = False


class CommandsAttached(Protocol):
    """The slash commands the layers above the engine attach (heron/agent/deps.py `Attached`)."""

    @property
    def commands(self) -> dict[str, CommandHandler]: ...

    @property
    def status_lines(self) -> Callable[[], Awaitable[list[str]]] | None: ...


class Recording(Protocol):
    """A maintenance run as the commands use it (heron/agent/maintenance.py MaintenanceRun):
    model calls made outside any turn, recorded as a run of the conversation."""

    async def __call__(self, record: ModelCallRecord) -> None: ...

    def fail(self, reason: str) -> None: ...

    def provider(self, inner: Provider, purpose: str) -> Provider: ...

    @property
    def answered(self) -> bool: ...


class CommandEngine(Protocol):
    """What the commands use of the engine (heron/agent/engine.py), which they never import."""

    @property
    def store(self) -> Store: ...

    @property
    def provider(self) -> Provider: ...

    @property
    def choice(self) -> ModelChoice: ...

    @property
    def memory(self) -> MemoryService | None: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def memory_baseline(self) -> dict[str, str]: ...

    @property
    def attached(self) -> CommandsAttached: ...

    async def compact_now(
        self, conversation: Conversation, *, reason: str = "manual", window: int | None = None
    ) -> str: ...

    async def archive_for_memory(self, conversation: Conversation) -> None: ...

    async def end_kernel(self, conversation: Conversation) -> None: ...

    def compaction_setup(self) -> CompactionSetup: ...

    def maintenance(
        self, conversation_id: int, kind: str
    ) -> AbstractAsyncContextManager[Recording]: ...


@dataclass
class CommandContext:
    engine: CommandEngine
    key: str
    agent: str = "default"
    # Set by the AgentLoop: stops the in-process turn of `key` (saying what stopped it),
    # returning whether one ran.
    stop_local: Callable[[str, str | None], Awaitable[bool]] | None = None
    running_local: Callable[[str], bool] | None = None
    channel: str | None = None  # where the command was typed (what a stopped turn is told)

    @property
    def store(self) -> Store:
        return self.engine.store


# A slash command: the engine it runs on and the text after its name -> what it says.
CommandHandler = Callable[[CommandContext, str], Awaitable[CommandReply]]


NAMES: tuple[str, ...] = ("new", "stop", "status", "resume", "retry", "edit", "tree", "compact")
NAMES += ("help",)
NAMES += ("memory", "learn", "reflect")  # answered by heron/memory/commands.py
NAMES += ("goal",)  # sustained goals (heron/proactive/goals.py)
NAMES += ("model", "models")  # which model answers (heron chat switches it: channels/terminal.py)
# At once even while a turn runs.
PRIORITY = frozenset({"stop", "new", "status", "goal", "model", "models"})
# Need no turn lease: they write no history.
LEASE_FREE = frozenset({"stop", "status", "help", "model", "models"})


def parse(text: str) -> Command | None:
    stripped = text.strip()
    if not stripped.startswith("/"):
        return None
    head, _, arg = stripped[1:].partition(" ")
    if head not in NAMES:
        return None
    return Command(head, arg.strip())


def suggest(text: str, known: tuple[str, ...] = NAMES) -> str | None:
    """The known command one or two edits from a mistyped `/name` (`/stauts` -> `status`),
    or None: a known command, a word far from every command, or not a command's shape (a
    path such as /tmp/x) goes on as it is."""
    stripped = text.strip()
    head = stripped[1:].partition(" ")[0].lower()
    if not stripped.startswith("/") or not head.isalpha() or head in known:
        return None
    near = [(edits(head, name), name) for name in known]
    near = [(d, name) for d, name in near if d <= 2 and 2 * d < len(name)]
    return min(near)[1] if near else None


def typo_notice(text: str, known: tuple[str, ...] = NAMES) -> str | None:
    """What a channel says instead of sending a mistyped command to the model
    (`unknown command /stauts; did you mean /status?`), or None when `text` is no such typo."""
    near = suggest(text, known)
    if near is None:
        return None
    return f"unknown command {text.strip().partition(' ')[0]}; did you mean /{near}?"


def edits(a: str, b: str) -> int:
    """Edit distance with swaps of two neighbours counting as one (optimal string alignment):
    a typo such as `stauts` is one edit from `status`."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


async def run(command: Command, ctx: CommandContext) -> CommandReply:
    handler = _HANDLERS.get(command.name) or ctx.engine.attached.commands.get(command.name)
    if handler is None:  # a service's command (NAMES) that this process did not attach
        return CommandReply(f"/{command.name} is not available in this session.")
    return await handler(ctx, command.arg)


# ---- handlers ---------------------------------------------------------------------------------


async def _help(ctx: CommandContext, arg: str) -> CommandReply:
    return CommandReply(help_text(ctx.engine.choice.embedded))


async def _model(ctx: CommandContext, arg: str) -> CommandReply:
    """/model (and /models): the model in use and how to pick another. Never a turn: typed
    to an agent CLI first, it went to the model as a paid message. The engine's model is its
    process's, for every conversation (a serve's for all its clients), so it is not switched
    here: `heron chat` in its own process takes `/model NAME` before it gets here."""
    choice = ctx.engine.choice
    lines = [f"model: {choice.provider}/{choice.model}"]
    if arg:
        lines.append(
            f"It stays: this process answers every conversation with it. To talk to {arg} "
            f"here: heron chat --model {arg} -c {ctx.key}"
        )
    else:
        lines.append(
            "In heron chat, /model NAME switches (a model name, or a .gguf path, as --model "
            "takes); `heron models` lists what the server offers."
        )
    return CommandReply("\n".join(lines))


async def _stop(ctx: CommandContext, arg: str) -> CommandReply:
    here = stopped_by("stop", ctx.channel)
    if ctx.stop_local is not None and await ctx.stop_local(ctx.key, here):
        return CommandReply("Stopped. What the turn finished is kept.", code=STOP_ANSWER_CODE)
    conv = await ctx.store.call(ctx.store.conversation, ctx.key)
    if conv is None:
        return CommandReply("Nothing is running.")
    holder = await ctx.store.call(es.lease_holder, ctx.store, conv.id)
    if holder is None:
        return CommandReply("Nothing is running.")
    # Another process runs it: it notices the bump within a second and stops as /stop stops
    # a turn here (heron/agent/turn.py, `stops_elsewhere`), telling its person who did.
    by = stopped_by("stop", ctx.channel, os.getpid())
    await ctx.store.call(es.bump_epoch, ctx.store, conv.id, by)
    said = f"Stopped {holder.describe()}. What it finished is kept."
    return CommandReply(said, code=STOP_ANSWER_CODE)


async def _new(ctx: CommandContext, arg: str) -> CommandReply:
    if ctx.stop_local is not None:
        await ctx.stop_local(ctx.key, stopped_by("new", ctx.channel))
    # The turn machine bumped the epoch before taking the lease, so a turn still running in
    # another process is already stale.
    conv = await ctx.store.call(ctx.store.open_conversation, ctx.key, ctx.agent)
    await ctx.engine.end_kernel(conv)  # a fresh start: no variables carried over
    if conv.head_id is not None:
        separator = Message("assistant", [Text(SEPARATOR)])
        await ctx.store.call(ctx.store.append, conv.id, separator, kind="separator")
        await ctx.engine.archive_for_memory(conv)  # returns at once, working in the back
    return CommandReply(
        "New conversation started. The transcript above is kept; the model no longer sees it."
    )


async def _status(ctx: CommandContext, arg: str) -> CommandReply:
    engine = ctx.engine
    conv = await ctx.store.call(ctx.store.conversation, ctx.key)
    window = engine.choice.profile.context_window
    lines = [f"model: {engine.choice.provider}/{engine.choice.model}"]
    read = file_summary(engine.choice)
    if read:  # a local file: the window and tools it allows
        lines.append(f"model {read}")
    head = len(lines) + 2  # the budget goes after the context line
    if conv is None:
        lines += [
            f"conversation: {ctx.key} (new)",
            f"context: 0 tokens (0.0% of {window:,})",
            "cache hit rate: no turns yet",
            "turn: idle",
        ]
        lines += await _more_status(ctx)
        return CommandReply("\n".join([*lines[:head], *_budget(engine), *lines[head:]]))
    used = await ctx.store.call(_usage, ctx.store, conv.id, off_loop=True)
    running = bool(ctx.running_local and ctx.running_local(ctx.key))
    holder = None if running else await ctx.store.call(es.lease_holder, ctx.store, conv.id)
    turn = "running" if running else (f"running ({holder.describe()})" if holder else "idle")
    lines += [
        f"conversation: {conv.key} ({plural(used.turns, 'turn')})",
        await _context_line(ctx, conv, used, window),
        f"cache hit rate: {_cache_rate(used)}",
        f"turn: {turn}",
    ]
    lines += await _more_status(ctx)
    return CommandReply("\n".join([*lines[:head], *_budget(engine), *lines[head:]]))


async def _more_status(ctx: CommandContext) -> list[str]:
    """The lines after the turn's: what runs without the person, then what the process
    attached (heron/scale: the workers alive)."""
    lines = await ctx.store.call(_proactive, ctx)
    more = ctx.engine.attached.status_lines
    return lines + (await more() if more is not None else [])


def _proactive(ctx: CommandContext) -> list[str]:
    """What runs without the person: this conversation's goal, the subagents that will report
    back to it and questions waiting there (heron/store/runs.py), then its scheduled jobs, the
    nightly review and the heartbeat (heron/tools/schedule.py)."""
    from heron.store.runs import status_lines as work_lines
    from heron.tools.schedule import status_lines

    zone = ctx.engine.settings.timezone  # one /status, one clock: the agent's
    return work_lines(ctx.store, ctx.key, time.time(), zone) + status_lines(
        ctx.store, ctx.key, zone
    )


def _budget(engine: CommandEngine) -> list[str]:
    """The budgets of the window: `heron conversations show KEY --budget` says
    what each part takes now."""
    from heron.compaction.core import deps_for
    from heron.compaction.inspect import budget_lines

    return ["budget (tokens, share of the window):", *budget_lines(deps_for(engine).budget)]


@dataclass(frozen=True)
class _Used:
    """What /status counts of the turns since the last /new (`_usage`)."""

    tokens: int  # the last model call's input and output as the server counted them (0: none)
    turns: int
    rate: float | None  # cache hit rate over the recent turns the server counted (None: none)
    calls: int  # model calls made in those turns, counted or not
    stopped: bool  # the last turn had a call stopped before the server counted it (Ctrl-C)


def _usage(store: Store, conversation_id: int) -> _Used:
    """Context used by the last model call; cache hit rate over the recent turns. Only the
    turns after the last /new count: the ones before it are no longer in the model's context."""
    since = store.last_separator(conversation_id)
    turns = [t for t in store.turns(conversation_id) if t.started >= since]
    recent = [t for t in turns[-RECENT_TURNS:] if t.usage.input]
    total = sum(t.usage.input for t in recent)
    rate = sum(t.usage.cache_read for t in recent) / total if total else None
    used = store.last_call_tokens(conversation_id) if turns else 0
    calls = sum(t.model_calls for t in turns)
    return _Used(used, len(turns), rate, calls, bool(turns) and turns[-1].usage_unknown)


async def _context_line(ctx: CommandContext, conv: Conversation, used: _Used, window: int) -> str:
    """The context used: the last call's count, or, when calls were made but their count never
    came (a turn stopped mid-reply: the usage comes at a stream's end), the estimate of what
    the next request starts from, said to be one."""
    if used.tokens or not used.calls:
        return f"context: {used.tokens:,} tokens ({100 * used.tokens / window:.1f}% of {window:,})"
    from heron.compaction.core import deps_for, tokens_of
    from heron.compaction.inspect import model_view

    def estimate() -> int:
        deps = deps_for(ctx.engine)
        return tokens_of(deps, *model_view(deps, conv))

    tokens = await asyncio.to_thread(estimate)  # the whole branch is read: off the loop
    why = "was stopped before its count came" if used.stopped else "came without a count"
    return (
        f"context: about {tokens:,} tokens ({100 * tokens / window:.1f}% of {window:,};"
        f" estimated: the last call {why})"
    )


def _cache_rate(used: _Used) -> str:
    """The cache hit rate over the recent turns, or why there is none."""
    if used.rate is not None:
        return f"{used.rate:.0%} over the last {plural(min(used.turns, RECENT_TURNS), 'turn')}"
    if not used.calls:
        return "no model calls yet"
    calls = plural(used.calls, "model call")
    if used.stopped:
        return f"not known: {calls} so far, stopped before the server counted any"
    return f"not known: the server sent no token counts for {calls}"


def switch_refused(found: Command | None, key: str) -> str | None:
    """What a `/resume KEY` to another conversation, sent while a turn runs in `key`, is
    refused with; None for any other message. Queued behind the turn, the switch would come
    only as it ends, and what the person sends meanwhile would go to that turn as mail."""
    if found is None or found.name != "resume" or found.arg in ("", key):
        return None
    return (
        f"A turn is running in {key!r}, so /resume {found.arg} was not done: what you sent "
        f"next would have gone to that turn. Send /resume {found.arg} once this turn ends, "
        "or /stop it first."
    )


async def _resume(ctx: CommandContext, arg: str) -> CommandReply:
    if arg:
        conv = await ctx.store.call(ctx.store.conversation, arg)
        if conv is None:
            return CommandReply(f"No conversation {arg!r}. /resume lists them.")
        branch = await ctx.store.call(ctx.store.branch, conv.id, off_loop=True)
        last = recap(branch)
        said = f"Resumed {conv.key}; where it was:\n" + "\n".join(last) if last else ""
        return CommandReply(said or f"Resumed {conv.key}.", switch_to=conv.key)
    rows = await ctx.store.call(ctx.store.conversations, 20)
    if not rows:
        return CommandReply("No conversations yet.")
    lines = ["Conversations (newest first); /resume KEY continues one:"]
    lines += [f"  {c.key}  {c.title or ''}".rstrip() for c in rows]
    return CommandReply("\n".join(lines))


RECAP_CHARS = 240  # of each side of the last exchange /resume shows


def recap(rows: list[StoredMessage]) -> list[str]:
    """The branch's last exchange, short: the person's last message and the last reply to it
    (a chat that resumed landed on an empty prompt, with nothing of where it was)."""
    typed = _user_messages(rows)
    if not typed:
        return []
    after = rows[[r.id for r in rows].index(typed[-1].id) + 1 :]
    said = [r for r in after if r.role == "assistant" and r.message.text.strip()]
    lines = [f"  you › {_short(typed[-1].message.text, RECAP_CHARS)}"]
    return [*lines, f"  heron › {_short(said[-1].message.text, RECAP_CHARS)}"] if said else lines


def _user_messages(rows: list[StoredMessage]) -> list[StoredMessage]:
    """Messages the user typed (not tool results, not separators, not Heron's own prompts)."""
    return [
        r
        for r in rows
        if r.role == "user"
        and r.kind == "message"
        and not r.message.tool_results
        and r.author in (None, "user")
    ]


async def _retry(ctx: CommandContext, arg: str) -> CommandReply:
    conv = await ctx.store.call(ctx.store.conversation, ctx.key)
    rows = await ctx.store.call(ctx.store.branch, conv.id, off_loop=True) if conv else []
    typed = _user_messages(rows)
    if conv is None or not typed:
        return CommandReply(NOTHING_TO_RETRY)
    last = typed[-1]
    if _after_new(rows, last):
        return CommandReply(NOTHING_SINCE_NEW)
    # Its turn failed, or (`heron run --retry`) a /stop or a crash left only an interrupted
    # reply: answer it as it stands, the work done and the partial reply kept in view.
    unanswered = arg.strip() == RETRY_UNANSWERED
    if not _answered(rows, last, stopped=not unanswered):
        return CommandReply(run_text=last.message.text, answer_id=last.id)
    if unanswered:
        return CommandReply(ALREADY_ANSWERED)  # `heron run --retry` never redoes an answer
    await ctx.store.call(ctx.store.set_head, conv.id, last.parent_id)
    return CommandReply(run_text=last.message.text)


def _after_new(rows: list[StoredMessage], message: StoredMessage) -> bool:
    """Whether a /new separator follows `message` on the branch: a retry of it would move the
    head back before the separator, undoing the /new without a word."""
    after = rows[[r.id for r in rows].index(message.id) + 1 :]
    return any(r.kind == "separator" for r in after)


def _answered(rows: list[StoredMessage], message: StoredMessage, *, stopped: bool = True) -> bool:
    """Whether a final answer (an assistant message without tool calls) follows `message`;
    `stopped=False`: not counting the reply a /stop or a crash left (meta `interrupted`), which
    `heron run --retry` answers where it stands."""
    after = rows[[r.id for r in rows].index(message.id) + 1 :]
    return any(
        r.role == "assistant"
        and not r.message.tool_calls
        and (stopped or not r.meta.get("interrupted"))
        for r in after
    )


def retry_hint(key: str) -> str:
    """What `heron run` says after a failed turn."""
    return (
        f"Your message is saved in conversation {key!r}; `heron run --retry -c {key}` answers "
        "it again without storing it twice."
    )


async def _edit(ctx: CommandContext, arg: str) -> CommandReply:
    number, _, text = arg.partition(" ")
    conv = await ctx.store.call(ctx.store.conversation, ctx.key)
    rows = await ctx.store.call(ctx.store.branch, conv.id, off_loop=True) if conv else []
    typed = _user_messages(rows)
    if not typed:
        return CommandReply("Nothing to edit yet: /edit N TEXT replaces a message you sent.")
    if not number.isdigit() or not 1 <= int(number) <= len(typed) or not text.strip():
        return CommandReply(f"Usage: /edit N TEXT, with N from 1 to {len(typed)} (see /tree).")
    target = typed[int(number) - 1]
    assert conv is not None
    await ctx.store.call(ctx.store.set_head, conv.id, target.parent_id)
    return CommandReply(run_text=text.strip())


async def _tree(ctx: CommandContext, arg: str) -> CommandReply:
    conv = await ctx.store.call(ctx.store.conversation, ctx.key)
    if conv is None or conv.head_id is None:
        return CommandReply("This conversation is empty.")
    leaves = await ctx.store.call(_leaves, ctx.store, conv.id, off_loop=True)
    if arg:
        if not arg.isdigit() or not 1 <= int(arg) <= len(leaves):
            return CommandReply(f"Give a branch number from 1 to {len(leaves)}.")
        leaf, label = leaves[int(arg) - 1]
        await ctx.store.call(ctx.store.set_head, conv.id, leaf.id)
        return CommandReply(f"Switched to branch {arg}: {label}")
    rows = await ctx.store.call(ctx.store.branch, conv.id, off_loop=True)
    on_branch = {r.id for r in rows}
    lines = [f"Branches of {conv.key} (* current; /tree N switches, /edit N TEXT rewinds):"]
    for i, (leaf, label) in enumerate(leaves, 1):
        lines.append(f"{'*' if leaf.id in on_branch else ' '} {i}. {label}")
    lines.append("Your messages on the current branch:")
    for i, r in enumerate(_user_messages(rows), 1):
        lines.append(f"  {i}. {_short(r.message.text)}")
    return CommandReply("\n".join(lines))


def _leaves(store: Store, conversation_id: int) -> list[tuple[StoredMessage, str]]:
    """Each branch's last message and its label, numbered by where the branch starts (the
    first message it does not share), so a branch keeps its number as it grows; a branch a
    /retry or /edit made says which of your messages it redoes (`_origin`)."""
    rows = store.all_messages(conversation_id)
    by_id = {r.id: r for r in rows}
    children: dict[int | None, list[StoredMessage]] = {}
    for r in rows:
        children.setdefault(r.parent_id, []).append(r)

    def start(leaf: StoredMessage) -> StoredMessage:
        at = leaf
        while at.parent_id is not None and len(children[at.parent_id]) == 1:
            at = by_id[at.parent_id]
        return at

    leaves = sorted((r for r in rows if r.id not in children), key=lambda r: start(r).id)
    # Your messages from the root to each row, itself included (a parent's id is smaller):
    # the number /edit N gives a message on its branch.
    numbers: dict[int | None, int] = {None: 0}
    for r in rows:
        numbers[r.id] = numbers.get(r.parent_id, 0) + len(_user_messages([r]))
    return [
        (leaf, _label(leaf, by_id) + _origin(start(leaf), children, numbers)) for leaf in leaves
    ]


def _origin(
    start: StoredMessage,
    children: dict[int | None, list[StoredMessage]],
    numbers: dict[int | None, int],
) -> str:
    """What a branch redoes, from its first own message: /retry and /edit write your message
    again beside the one they replace (the same parent), so the newest of yours before it
    there is the one redone; the same words are a retry. Named by its number on the branch,
    as /edit N takes it. Nothing for the first branch."""
    older = [r for r in _user_messages(children[start.parent_id]) if r.id < start.id]
    if not older or not _user_messages([start]):
        return ""
    was, number = older[-1], numbers[start.id]
    if was.message.text == start.message.text:
        return f" (retry of message {number})"
    return f" (edit of message {number}: “{_short(was.message.text, 30)}”)"


def _label(leaf: StoredMessage, by_id: dict[int, StoredMessage]) -> str:
    """A branch as its last exchange: the last message you typed on it, then what answered."""
    at: StoredMessage | None = leaf
    while at is not None and not _user_messages([at]):
        at = by_id.get(at.parent_id) if at.parent_id is not None else None
    if at is None or at is leaf:
        return _short(leaf.message.text)
    return f"{_short(at.message.text, 30)} → {_short(leaf.message.text, 40)}"


def _short(text: str, limit: int = 60) -> str:
    line = " ".join(without_labels(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


async def _compact(ctx: CommandContext, arg: str) -> CommandReply:
    """/compact: a consolidation now, its summary call recorded as a `compact` run."""
    from heron.compaction import compact_conversation

    conv = await ctx.store.call(ctx.store.open_conversation, ctx.key, ctx.agent)
    async with ctx.engine.maintenance(conv.id, COMPACT) as run:
        report = await compact_conversation(ctx.engine, conv, reason="manual", on_call=run)
        if report.kind == "failed":
            run.fail(report.error or "the summary failed")
    return CommandReply(report.describe(), model_answered=run.answered)


NO_MEMORY = "Memory is off in this chat (--ephemeral): nothing is kept or reviewed."


async def _memory(ctx: CommandContext, arg: str) -> CommandReply:
    """/memory [review | accept ID | reject ID]. The review checklists need the terminal's UI:
    a channel without one gets the list and /memory accept ID."""
    from heron.memory.commands import memory_command

    service = ctx.engine.memory
    if service is None:
        return CommandReply(NO_MEMORY)
    return CommandReply(await asyncio.to_thread(memory_command, service, arg))


async def _learn(ctx: CommandContext, arg: str) -> CommandReply:
    """/learn, /reflect: the review and tidy passes now (suggestions only), and what memory
    gained, changed and lost since the engine opened."""
    from heron.compaction.core import window_for
    from heron.memory.commands import learn

    service = ctx.engine.memory
    if service is None:
        return CommandReply(NO_MEMORY)
    conv = await ctx.store.call(ctx.store.open_conversation, ctx.key, ctx.agent)
    provider, baseline = ctx.engine.provider, ctx.engine.memory_baseline
    async with ctx.engine.maintenance(conv.id, LEARN) as run:
        passes = (run.provider(provider, "review"), run.provider(provider, "tidy"))
        report = await learn(service, passes, conv.id, baseline, window_for(ctx.engine))
    text = report.text()
    if report.suggested:
        text += "\nReview them with /memory review."
    return CommandReply(text, model_answered=run.answered)


_HANDLERS: dict[str, CommandHandler] = {
    "help": _help,
    "stop": _stop,
    "new": _new,
    "status": _status,
    "resume": _resume,
    "retry": _retry,
    "edit": _edit,
    "tree": _tree,
    "compact": _compact,
    "memory": _memory,
    "learn": _learn,
    "reflect": _learn,
    "model": _model,
    "models": _model,
}
