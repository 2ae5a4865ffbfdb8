"""Plain-text information commands: conversations, config, models."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heron import timefmt
from heron.attachments import inline_files
from heron.channels.common import echo, table
from heron.config import SERVER_DEFAULT_MODEL, Settings
from heron.errors import HeronError, StoreError
from heron.messages import File, Message, Text, Thinking, ToolCall, ToolResult, plural
from heron.providers.endpoint import shown_url
from heron.providers.profiles import PLACEHOLDER_KEY, ModelChoice, file_summary, tool_calls
from heron.providers.wire import file_label
from heron.store import Conversation, Store, StoredMessage, Turn, goals, runs
from heron.store import engine_state as es
from heron.store.compactions import Compaction, compactions
from heron.store.db import BUSY_TIMEOUT_S
from heron.store.records import RECALL_FLAG, shown_as

if TYPE_CHECKING:
    from heron.compaction.core import ContextDeps
    from heron.providers.anthropic import AnthropicProvider
    from heron.providers.openai_compat import OpenAICompatProvider


def open_store(
    settings: Settings,
    *,
    reading: bool = False,
    busy_timeout: float = BUSY_TIMEOUT_S,
    make_home: bool = True,
) -> Store:
    """The home's store. `reading`: the command only reads (list, show, search, export), so
    a home whose disk refuses writes (read-only, full) is opened read-only, and said so once
    on stderr, rather than refused. `busy_timeout`: seconds to wait for another process's
    lock on the file. `make_home=False` (`heron status`): heron.db must be there already; the
    home is neither made nor made private (`Paths.ensure`)."""
    where = settings.database if make_home or settings.store_url else settings.paths.db
    store = Store(where, reading=reading, busy_timeout=busy_timeout)
    if store.read_only is not None:
        echo(f"heron: {store.read_only.summary}; {READ_ONLY_NOTE}", err=True)
    return store


READ_ONLY_NOTE = "reading it as it stands (nothing can be saved there until that changes)"


def list_conversations(settings: Settings, limit: int) -> None:
    store = open_store(settings, reading=True)
    rows = store.conversations(limit + 1)  # one more: whether to say there are others
    if not rows:
        echo("No conversations yet. Start one with: heron chat")
        return
    shown, zone = rows[:limit], settings.timezone
    lines = [
        (c.key, timefmt.when(c.updated, zone), _turns(store, c.id), c.title or "") for c in shown
    ]
    table(("KEY", "UPDATED", "TURNS", "TITLE"), lines)
    if len(rows) > limit:
        more = store.conversation_count() - limit
        echo(
            f"… and {plural(more, 'older conversation')}: heron conversations list --limit "
            f"{limit + more}, or heron conversations search WORDS"
        )


def _turns(store: Store, conversation_id: int) -> str:
    """The turns of the current branch, and how many branches when more than one ("3 (2
    branches)"): a retried answer's turn is on the branch it left."""
    turns, branches = store.branch_counts(conversation_id)
    return f"{turns} ({branches} branches)" if branches > 1 else str(turns)


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Asked:
    """The questions of `ask_user` in the conversation shown, and the calls shown as one (their
    results are then left out: the answer is on its own line)."""

    questions: runs.Questions
    shown: set[str] = field(default_factory=set)

    def asking(self, call: ToolCall, created: float) -> runs.Run | None:
        """The question asked by `call` (of a row stored at `created`), then shown as one; None
        when no question row names the call (it is shown as a plain call then)."""
        run = self.questions.of(call.id, created) if call.name == "ask_user" else None
        if run is not None:
            self.shown.add(call.id)
        return run

    def lines(self, call: ToolCall, created: float) -> list[str] | None:
        """The question asked by `call` and the person's answer, as lines (`asking`)."""
        run = self.asking(call, created)
        if run is None:
            return None
        if run.status == "answered":
            return [f"assistant asks: {run.task}", f"you: {run.result or ''}"]
        return [f"assistant asks: {run.task}", f"  (no answer: {run.status})"]


def who_wrote(message: Message, author: str | None) -> str:
    """Who a row is shown as: you, assistant, heron or tool (`records.shown_as`)."""
    results_only = bool(message.tool_results) and not message.text.strip()
    return shown_as(message.role, author, results_only)


def render_message(
    message: Message,
    author: str | None = None,
    asked: Asked | None = None,
    created: float = 0.0,
    *,
    whole: bool = False,
    meta: Mapping[str, Any] | None = None,
) -> Iterator[str]:
    """A message as lines, each naming who wrote it as `who_wrote` does. With `asked`, a
    question of `ask_user` is shown as the question and the person's answer. `whole`: tool
    calls and results too are not shortened. A text file the person attached that went into
    the message inline (its row's `meta` names it) is said as attached, its block under it."""
    short = (lambda text, limit: text) if whole else _short
    who = who_wrote(message, author)
    inline = inline_files(message, meta or {})
    for n, part in enumerate(message.parts):
        if n in inline and isinstance(part, Text):
            yield f"{who} attached {file_label(inline[n])}:"
            yield part.text.lstrip("\n").partition("\n")[2]  # the block the model read
        elif isinstance(part, Text) and part.text.strip():
            yield f"{who}: {part.text}"
        elif isinstance(part, Thinking) and part.text:
            yield f"  (thinking) {_short(part.text)}"
        elif isinstance(part, ToolCall):
            question = asked.lines(part, created) if asked is not None else None
            if question is not None:
                yield from question
                continue
            args = json.dumps(part.args, ensure_ascii=False)
            yield f"  → {part.name}({short(args, 300)})  [{part.id}]"
        elif isinstance(part, ToolResult):
            if asked is not None and part.call_id in asked.shown:
                continue
            mark = "✗" if part.is_error else "←"
            yield f"  {mark} {short(part.content, 300)}"
        elif isinstance(part, File):
            yield f"{who} attached {file_label(part)}"


# A call stopped mid-reply: the provider never said what it counted (heron/agent/record.py).
NOT_ALL_COUNTED = " · not all counted: a model call was stopped before its usage came"


def _turn_header(n: int, turn: Turn) -> str:
    u = turn.usage
    return (
        f"── turn {n} · {turn.run_id} · {turn.status} · {plural(turn.model_calls, 'model call')}, "
        f"{plural(turn.tool_calls, 'tool call')} · tokens in {u.input} (cache read {u.cache_read}) "
        f"out {u.output}" + (NOT_ALL_COUNTED if turn.usage_unknown else "")
    )


def serving_choice(settings: Settings, key: str) -> ModelChoice | None:
    """The model a serve on this home answers `key` with, as the budgets need it (its name and
    window), when one runs and this command's environment asks for no other (`serve_differs`:
    then this process's own choice applies, as a run of it would); None otherwise."""
    from heron.channels.remote import serve_differs, serve_welcome
    from heron.providers.profiles import ModelProfile, profile_for

    welcome = serve_welcome(key, settings.paths.home)
    if welcome is None or serve_differs(welcome, settings.env) or "model_name" not in welcome:
        return None
    name = str(welcome["model_name"])
    given = welcome.get("profile")
    if isinstance(given, dict):  # the serve's own (a local file's is read from the file)
        known = {f.name for f in dataclasses.fields(ModelProfile)}
        profile = ModelProfile(**{k: v for k, v in given.items() if k in known})
    else:  # a serve of an earlier Heron: its model's profile by name, with its window
        profile = profile_for(name, settings.config.models)
        profile = ModelProfile(**{**profile.__dict__, "context_window": int(welcome["window"])})
    provider = str(welcome.get("model", "")).partition("/")[0] or "openai"
    embedded = bool(welcome.get("embedded"))
    return ModelChoice(provider, name, profile=profile, embedded=embedded)  # type: ignore[arg-type]


def next_request_deps(
    settings: Settings, store: Store, choice: ModelChoice | None, running: Any = None
) -> ContextDeps:
    """What a conversation's next request is built from, as the engine that sends it builds
    it: `running`, the serve's own engine (its tools, described as it described them), or the
    engine `heron chat` or `heron run` would open here for `choice` (else the configured model),
    with the tools the proactive layer attaches to it. Its prompt inputs are the engine's:
    the workspace files, the Memory section and Recent history, the sandbox's sentence."""
    from heron.agent.engine import view_engine
    from heron.compaction.core import deps_for
    from heron.proactive.wiring import TOOLS

    if choice is None:
        try:
            choice = settings.model()
        except HeronError:
            choice = ModelChoice("scripted", "unknown")
    return deps_for(view_engine(settings, store, choice, TOOLS, running))


def show_conversation(
    settings: Settings,
    key: str,
    *,
    compactions: bool = False,
    model_view: bool = False,
    budget: bool = False,
    message: int | None = None,
) -> None:
    store = open_store(settings, reading=True)
    conv = known(store, key)
    if message is not None:  # one message, from a search hit
        for line in message_lines(store, conv, message, settings.timezone):
            echo(line)
        return
    if budget:  # each part's budget, and what it takes now
        from heron.compaction.inspect import budget_report

        deps = next_request_deps(settings, store, serving_choice(settings, key))
        for line in budget_report(deps, conv):
            echo(line)
        return
    if compactions or model_view:  # what compaction did, and what the model sees
        for line in _compaction_views(settings, store, conv, compactions, model_view):
            echo(line)
        return
    record = _ended_said(store, read_record(store, conv))
    echo(f"Conversation {conv.key} · agent {conv.agent} · {_counted(record)}")
    seen: set[int] = set()
    asked = Asked(record.questions)
    for item in record.reading():
        if isinstance(item, goals.Goal):
            echo(_goal_line(item))
            continue
        for line in _lines(item, record, seen, asked):
            echo(line)
    for line in _rowless(record, seen, None):
        echo(line)


def _ended_said(store: Store, record: Record) -> Record:
    """A turn left `running` by a process that has ended (a `heron run` killed with kill -9,
    no serve to close it) is headed as what it is, not as work still going on. `show` only
    reads: the next turn there closes it."""
    running = [tid for tid, turn in record.turns.items() if turn.status == "running"]
    pid = es.ended_holder(store, record.conversation.id) if running else None
    if pid is None:
        return record
    said = f"running? (its process {pid} has ended; the next turn closes it)"
    for tid in running:
        record.turns[tid] = dataclasses.replace(record.turns[tid], status=said)
    return record


def _counted(record: Record) -> str:
    """The turns `show` lists (those whose message is on this branch, as `conversations list`
    counts them), and how many a retry or an edit left on other branches."""
    shown = plural(len(record.on_branch), "turn")
    elsewhere = record.elsewhere
    if not elsewhere:
        return shown
    where = "another branch" if elsewhere == 1 else "other branches"
    switch = f"/tree in heron chat -c {record.conversation.key} switches"
    return f"{shown} ({elsewhere} more on {where}: {switch})"


# Messages shown before and after the one `conversations show --message N` asks for.
AROUND = 2


def message_lines(store: Store, conv: Conversation, message_id: int, zone: str) -> Iterator[str]:
    """Message `message_id` of `conv` whole, with AROUND messages either side on the current
    branch (a message of another branch alone, said so): what a search hit names. Times are
    in `zone`, the agent's."""
    record = read_record(store, conv)
    place = next((i for i, row in enumerate(record.rows) if row.id == message_id), None)
    if place is None:
        row = next((r for r in store.all_messages(conv.id) if r.id == message_id), None)
        if row is None:
            raise StoreError(
                f"no message {message_id} in conversation {conv.key}",
                hint=f'Search it for message numbers: heron conversations search "WORDS" '
                f"-c {conv.key}",
            )
        yield f"Conversation {conv.key} · message {message_id}, on another branch (/retry, "
        yield "/edit or /tree left it):"
        yield from render_message(
            row.message, row.author, None, row.created, whole=True, meta=row.meta
        )
        return
    shown = record.rows[max(0, place - AROUND) : place + AROUND + 1]
    yield f"Conversation {conv.key} · message {message_id} whole, with its neighbours:"
    seen: set[int] = set()
    asked = Asked(record.questions)
    for row in shown:
        asked_for = row.id == message_id
        yield from _header_once(row, record, seen)
        mark = " (the one asked for)" if asked_for else ""
        yield f"── message {row.id} · {timefmt.when(row.created, zone)}{mark}"
        yield from render_message(
            row.message, row.author, asked, row.created, whole=asked_for, meta=row.meta
        )


def known(store: Store, key: str) -> Conversation:
    """Conversation `key`, or the error every command gives for a key that names none."""
    conv = store.conversation(key)
    if conv is None:
        raise StoreError(f"no conversation {key!r}", hint="See: heron conversations list")
    return conv


@dataclass
class Record:
    """What `conversations show` and `conversations export` read of one conversation: its
    turns (numbered from 1 in the order they ran, on any branch, as `show` heads them), the
    rows of its current branch (auto-recall's under the turn of the message they answer), the
    questions `ask_user` asked in it and the goals set in it, oldest first."""

    conversation: Conversation
    turns: dict[int, Turn]
    rows: list[StoredMessage]
    questions: runs.Questions
    goals_set: list[goals.Goal]
    # The compactions that folded rows of the branch, oldest first: from the last row each
    # folded on, the model read its summary in place of the rows (which stay in the record).
    folds: list[Compaction] = field(default_factory=list)
    numbers: dict[int, int] = field(init=False)  # turn id -> its number

    def __post_init__(self) -> None:
        self.numbers = {tid: n for n, tid in enumerate(self.turns, 1)}

    @functools.cached_property
    def on_branch(self) -> list[int]:
        """The turns whose message is on this branch, in the order they ran."""
        ids = {row.id for row in self.rows}
        return [tid for tid, turn in self.turns.items() if turn.user_message_id in ids]

    @functools.cached_property
    def rowless(self) -> list[int]:
        """This branch's turns that wrote no row of their own (a retry that failed again)."""
        wrote = {row.turn_id for row in self.rows}
        return [tid for tid in self.on_branch if tid not in wrote]

    @property
    def elsewhere(self) -> int:
        """How many turns answered a message that is on another branch only."""
        stored = [t for t in self.turns.values() if t.user_message_id is not None]
        return len(stored) - len(self.on_branch)

    def reading(self) -> Iterator[StoredMessage | goals.Goal]:
        """The rows with the goals among them: `/goal TEXT` stores no message of its own, so
        each goal comes before the first row written after it was set."""
        pending = list(self.goals_set)
        for row in self.rows:
            while pending and pending[0].created <= row.created:
                yield pending.pop(0)
            yield row
        yield from pending


def read_record(store: Store, conv: Conversation) -> Record:
    turns = {t.id: t for t in store.turns(conv.id)}
    set_goals = sorted(goals.history(store, conv.key, limit=100), key=lambda g: g.created)
    asked = runs.questions(store, conv.key)
    rows = list(_recall_under_its_turn(store.branch(conv.id)))
    on_branch = {row.id for row in rows}
    made = [c for c in compactions(store, conv.id) if c.last_row_id in on_branch]
    return Record(conv, turns, rows, asked, set_goals, made)


def _recall_under_its_turn(rows: list[StoredMessage]) -> Iterator[StoredMessage]:
    """The rows in order, auto-recall's (stored just before the message they answer, outside
    any turn) given that message's turn: its header then comes before them, not after."""
    held: list[StoredMessage] = []
    for row in rows:
        if row.turn_id is None and row.meta.get(RECALL_FLAG):
            held.append(row)
            continue
        yield from (dataclasses.replace(h, turn_id=row.turn_id) for h in held)
        held = []
        yield row
    yield from held


def _goal_line(goal: goals.Goal) -> str:
    """Where a goal was set (`/goal TEXT` stores no message of its own): its objective and
    what became of it."""
    return f"── goal set ({goal.status}): {goal.objective}"


def _compaction_views(
    settings: Settings, store: Store, conv: Any, compactions: bool, model_view: bool
) -> Iterator[str]:
    from heron.compaction import inspect

    if compactions:
        yield from inspect.compaction_lines(store, conv.id, settings.timezone)
    if model_view:
        deps = next_request_deps(settings, store, serving_choice(settings, conv.key))
        system, messages = inspect.model_view(deps, conv)
        yield "── system"
        yield system
        yield f"── tools ({len(deps.tools)}, sent before the system prompt)"
        yield from (f"{spec.name}: {spec.description}" for spec in deps.tools)
        for message in messages:
            yield f"── {message.role}"
            for part in message.parts:
                if isinstance(part, Text):
                    yield part.text
                elif isinstance(part, ToolCall):
                    args = json.dumps(part.args, ensure_ascii=False)
                    yield f"[call {part.id}] {part.name}({args})"
                elif isinstance(part, ToolResult):
                    error = " error" if part.is_error else ""
                    yield f"[result {part.call_id}{error}] {part.content}"
                elif isinstance(part, File):
                    yield f"[file {file_label(part)}]"


def _lines(stored: StoredMessage, record: Record, seen: set[int], asked: Asked) -> Iterator[str]:
    yield from _header_once(stored, record, seen)
    yield from render_message(
        stored.message, stored.author, asked, stored.created, meta=stored.meta
    )


def _header_once(stored: StoredMessage, record: Record, seen: set[int]) -> Iterator[str]:
    """The header of the row's turn, before its first row shown (`seen`: the turns headed)."""
    tid = stored.turn_id
    if tid is not None and tid not in seen and tid in record.turns:
        yield from _rowless(record, seen, tid)
        seen.add(tid)
        yield _turn_header(record.numbers[tid], record.turns[tid])


def _rowless(record: Record, seen: set[int], before: int | None) -> Iterator[str]:
    """The headers of this branch's turns that wrote no row (a retry that failed again) and
    ran before turn `before` (None: all left), where they ran: the header counts them."""
    for tid in record.rowless:
        if tid not in seen and (before is None or tid < before):
            seen.add(tid)
            yield _turn_header(record.numbers[tid], record.turns[tid])


def delete_conversation(
    settings: Settings, key: str, confirm: Callable[[str], object] | None = None
) -> None:
    """`heron conversations delete`: what refuses the delete (no such conversation, one in
    use) is said before `confirm` asks the person, not after they said yes."""
    store = open_store(settings)
    if confirm is not None:
        removable(store, key)
        confirm(f"Delete conversation {key!r} and its whole history?")
    remove_conversation(store, key)
    echo(f"Deleted conversation {key!r}.")


def remove_conversation(store: Store, key: str) -> Conversation:
    """Delete `key` with its trace rows, refusing while anything uses it (the CLI's delete
    and the web UI's both come here); the conversation deleted."""
    conv = removable(store, key)
    store.delete_conversation(conv.id)
    # Its trace rows went with it; the blobs and nodes only it reached go now (shared ones stay).
    from heron.trace.blobs import collect_garbage

    with store.transaction() as conn:
        collect_garbage(conn)
    return conv


def removable(store: Store, key: str) -> Conversation:
    """The conversation `key`; a StoreError when there is none or anything still uses it."""
    conv = known(store, key)
    # Anything still using it (a running turn's lease, an open chat's presence) blocks the
    # delete, named so the user knows what to close (heron/store/engine_state.py).
    from heron.store.engine_state import users

    using = users(store, conv.id)
    if using:
        names = "; ".join(u.describe() for u in using)
        raise StoreError(
            f"conversation {key!r} is still in use: {names}",
            hint="Close that chat or stop that turn (/stop), then delete.",
        )
    # Proactive work that still needs it: a goal, a subagent reporting back, a waiting question.
    from heron.store.runs import work_in

    work = work_in(store, key)
    if work:
        raise StoreError(
            f"conversation {key!r} is still in use: " + "; ".join(work),
            hint="End each as it says, then delete.",
        )
    return conv


def _mask(value: str) -> str:
    return value[:6] + "…" + value[-2:] if len(value) > 10 else "…"


def show_config(settings: Settings) -> None:
    cfg = settings.config
    present = "present" if settings.paths.config.exists() else "absent"
    echo(f"config file: {settings.paths.config} ({present})")
    try:
        choice = settings.model()
        source = model_source(settings, choice)
        echo(f"model:       {choice.provider} / {choice.model} ({source})")
        for line in server_lines(choice):
            echo(line)
        p = choice.profile
        echo(
            f"profile:     window {p.context_window}, output cap {p.max_output}, "
            f"tools {tool_calls(p)}"
        )
        read = file_summary(choice)
        if read:
            echo(f"             {read}")
    except HeronError as e:
        echo(f"model:       none ({str(e).splitlines()[0]})")
    for name, key in sorted(cfg.api_keys.items()):
        echo(f"key [{name}]: {_mask(key)}")
    a = cfg.agent
    echo(
        f"agent:       max_model_calls {a.max_model_calls}, max_tokens_total {a.max_tokens_total}, "
        f"result_budget {a.result_budget}"
    )
    for said in _serve_news(settings):
        echo(said)


def _serve_news(settings: Settings) -> list[str]:
    """What `heron run` through the serve on this home would say of it first: the serve
    answers with the config.toml it started with (the lines above are the file's), or is
    another Heron."""
    from heron.channels.remote import serve_news, serve_welcome

    welcome = serve_welcome("personal", settings.paths.home)
    return [] if welcome is None else serve_news(welcome, settings.paths.home)


def server_lines(choice: ModelChoice) -> list[str]:
    """Where the model is reached and the setting that said so; for a server that got no
    key, that a placeholder goes instead (never a key itself)."""
    if choice.model_path is not None:
        return [f"file:        {choice.model_path}"]
    if choice.base_url is None:
        return []
    lines = [f"server:      {shown_url(choice.base_url)} (from {choice.url_source})"]
    if choice.api_key == PLACEHOLDER_KEY:
        lines.append(
            f"key:         none set: {PLACEHOLDER_KEY!r} is sent (a local server checks none; "
            "set HERON_API_KEY or api_key under [providers.openai] if yours does)"
        )
    return lines


def model_source(settings: Settings, choice: ModelChoice) -> str:
    """Where the model in use was named, in the order heron.config.choose_model reads them:
    what `heron config show` says in brackets after it."""
    if settings.env.get("HERON_MODEL"):
        return "from HERON_MODEL"
    if settings.config.model:
        return f"from {settings.paths.config.name}"
    if choice.embedded:
        return "from the offline fallback: nothing else is configured"
    if choice.model == SERVER_DEFAULT_MODEL and choice.base_url is not None:
        return "no model named, so `default` is sent; `heron models` lists the server's"
    return "from the provider's default"


def print_models(settings: Settings, model: str | None = None) -> bool:
    """The model in use (`model`, as --model names it, else the configured one), what its
    server offers, the built-in profiles and the overrides. False when the server in use
    could not list its models, or when the model `model` names cannot be used (a GGUF path
    with no file: it exited 0), everything else still printed, so that a script asking
    `heron models` hears of it in the exit code."""
    from heron.providers.profiles import _BUILTIN, attachments_taken

    served: list[str] | None = []
    try:
        choice: ModelChoice | None = settings.model(model)
    except HeronError as e:
        choice = None
        said = str(e)  # a sentence of its own: "In use: none. No OpenAI API key: ..."
        echo(f"In use: none. {said[:1].upper()}{said[1:]}")
        if model is not None:
            served = None  # the model asked for is not usable: not ok
    if choice is not None:
        echo(f"In use: {choice.provider} / {choice.model}")
        read = file_summary(choice)
        if read:  # a local file's profile is its own, not one of the table below
            echo(f"Profile {read}")
    if model is None:
        _serve_model(settings, choice)
    if choice is not None:
        served = show_served_models(settings, choice)
    echo("\nBuilt-in profiles:")
    rows = [
        (pat, f"{p.context_window:,}", f"{p.max_output:,}", tool_calls(p), attachments_taken(p))
        for pat, p in _BUILTIN
    ]
    table(("PATTERN", "WINDOW", "OUTPUT", "TOOLS", "ATTACHMENTS"), rows)
    overrides = settings.config.models
    if overrides:
        echo(f"\nOverrides in {settings.paths.config}:")
        for pattern, values in overrides.items():
            said = ", ".join(f"{k} = {json.dumps(v)}" for k, v in values.items())
            echo(f'[models."{pattern}"]  {said}')
            unmatched = _matches_none(pattern, choice, served or [])
            if unmatched:
                echo(f"  ({unmatched})")
    echo('\nOverride per model in config.toml: [models."<pattern>"] context_window = ...')
    return served is not None


def _matches_none(pattern: str, choice: ModelChoice | None, served: list[str]) -> str | None:
    """What `heron models` says under an override whose glob matches neither the model in use
    nor any the server lists (a typo, or a model not added yet: a warning, never an error);
    None when it matches one."""
    names = [choice.model] if choice is not None else []
    if any(fnmatch.fnmatch(name.lower(), pattern.lower()) for name in names + served):
        return None
    used = f"not {choice.model}, the model in use" if choice is not None else "no model is in use"
    listed = ", nor any the server lists" if served else ""
    return (
        f"matches no model here: {used}{listed}; check the pattern, or it waits for a model "
        "added later"
    )


def _serve_model(settings: Settings, choice: ModelChoice | None) -> None:
    """The model of the serve on this home, when it runs another (`heron serve --model`): a
    `heron run` through it gets that one."""
    from heron.channels.remote import serve_welcome

    welcome = serve_welcome("personal", settings.paths.home)
    if welcome is None or "model" not in welcome:
        return
    theirs = str(welcome["model"])
    if choice is not None and theirs == f"{choice.provider}/{choice.model}":
        return
    echo(f"heron serve on this home runs: {theirs.replace('/', ' / ', 1)}")
    if welcome.get("model_file"):
        echo(f"Profile {welcome['model_file']}")


# `heron models` asks the server for its list: a server that is down must not hold it long.
LIST_TIMEOUT = 5.0


def show_served_models(settings: Settings, choice: ModelChoice) -> list[str] | None:
    """What the server in use offers (GET /models of an OpenAI-compatible server, GET
    /v1/models of Anthropic's), each with the profile it would run with, and their names; or a
    line saying why the list could not be had, and what to do (then None). A local GGUF file
    has nothing to list."""
    import asyncio

    from heron.providers.profiles import profile_for

    provider = _lister(choice)
    if provider is None:
        return []

    async def ask() -> list[str]:
        try:
            return await provider.list_models(LIST_TIMEOUT)
        finally:
            await provider.aclose()

    where = provider.endpoint.named
    try:
        names = asyncio.run(ask())
    except HeronError as e:
        echo(f"\nThe models at {where} could not be listed: {e.summary}")
        if e.hint:
            echo(e.hint)
        return None
    if not names:
        echo(f"\nThe server at {where} lists no models.")
        return []
    echo(f"\nModels at {where}, with the profile each would run with:")
    rows = []
    for name in names:
        p = profile_for(name, settings.config.models)
        mark = "  (in use)" if name == choice.model else ""
        rows.append((name, f"{p.context_window:,}", f"{p.max_output:,}", tool_calls(p) + mark))
    table(("MODEL", "WINDOW", "OUTPUT", "TOOLS"), rows)
    return names


def _lister(choice: ModelChoice) -> OpenAICompatProvider | AnthropicProvider | None:
    """The adapter `heron models` asks (it sends no chat)."""
    if choice.provider == "openai":
        from heron.providers.openai_compat import OpenAICompatProvider

        key = choice.api_key or PLACEHOLDER_KEY
        return OpenAICompatProvider(
            choice.model, key, choice.base_url, url_source=choice.url_source
        )
    if choice.provider == "anthropic" and choice.api_key:
        from heron.providers.anthropic import AnthropicProvider

        return AnthropicProvider(
            choice.model, choice.api_key, choice.base_url, url_source=choice.url_source
        )
    return None
