"""`heron conversations export` and the browser's Download: one conversation's current branch,
whole, as Markdown to read or JSON to process.

Both read what `heron conversations show` prints (`info.read_record`: the rows of the current
branch, their turns, the questions `ask_user` asked and the goals set), from the store, whether
or not a serve runs, and cut nothing. The JSON keeps each message's parts in heron/messages.py's
own encoding (`part_to_dict`, what `parts_to_json` writes), so `parts_from_json` reads them back
as stored; a file is named by its name, type, size and sha256, its bytes never included. A
corrupt row is the placeholder the store decodes it to, as `show` prints it. The shape is
documented in docs/terminal.md ("Searching and exporting").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from heron import timefmt, workspace_io
from heron.attachments import longest_backticks
from heron.channels.common import echo
from heron.channels.info import Asked, Record, known, open_store, read_record, who_wrote
from heron.config import Settings
from heron.errors import ConfigError
from heron.messages import (
    File,
    JSONObject,
    JSONValue,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    part_to_dict,
    plural,
    size_label,
    usage_to_dict,
)
from heron.store import Store, StoredMessage, Turn, goals
from heron.store.compactions import Compaction

FORMATS = {"markdown": "markdown", "md": "markdown", "json": "json"}
SUFFIX = {"markdown": "md", "json": "json"}
MEDIA_TYPE = {"markdown": "text/markdown; charset=utf-8", "json": "application/json"}
VERSION = 1  # of the JSON's shape: raised when a field changes meaning or goes


def export_format(name: str | None, output: Path | None = None) -> str:
    """'markdown' or 'json' from `--format` (md is markdown); without one, json for an output
    file named *.json, else markdown. Anything else: a ConfigError naming the choices."""
    if name is None:
        return "json" if output is not None and output.suffix.lower() == ".json" else "markdown"
    found = FORMATS.get(name.strip().lower())
    if found is None:
        raise ConfigError(
            f"unknown export format {name!r}", hint="Use --format markdown (md) or --format json."
        )
    return found


def exported(store: Store, key: str, form: str, zone: str) -> tuple[str, int]:
    """Conversation `key` in `form` ('markdown' or 'json', as `export_format` gives), and how
    many messages it holds: the CLI's export and the browser's Download. The Markdown's times
    are in the agent's `zone` (the JSON's are epoch seconds). An unknown key is the StoreError
    of `info.known`."""
    record = read_record(store, known(store, key))
    text = to_markdown(record, zone) if form == "markdown" else to_json(record)
    return text, len(record.rows)


def export_conversation(
    settings: Settings, key: str, form: str | None, output: Path | None, *, force: bool = False
) -> None:
    """`heron conversations export`: to stdout, or to `output` (refused when it exists,
    unless `force`), then a line saying where it went."""
    chosen = export_format(form, output)
    store = open_store(settings, reading=True)
    try:
        text, count = exported(store, key, chosen, settings.timezone)
    finally:
        store.close()
    if output is None:
        echo(text, nl=False)
        return
    _write(output, text, force)
    echo(f"Exported {key!r} ({count} messages, {chosen}) to {output.absolute()}")


def _write(path: Path, text: str, force: bool) -> None:
    # Mode "x" refuses an existing file in the same call that creates it: nothing can appear
    # between a check and the write. --force writes through workspace_io, which puts a new
    # file in the name's place: a link there (one the agent planted in its workspace) is
    # replaced, never written through to the file it points at.
    try:
        if force:
            workspace_io.write(path.parent, path.name, text.encode("utf-8"))
        else:
            with path.open("x", encoding="utf-8") as out:
                out.write(text)
    except FileExistsError:
        raise ConfigError(
            f"{path} exists", hint="Add --force to replace it, or choose another -o FILE."
        ) from None
    except OSError as e:
        raise ConfigError(
            f"cannot write {path}: {e.strerror or e}",
            hint="Choose a file in a folder you can write.",
        ) from None


def filename(key: str, form: str) -> str:
    """The name a download is saved under: `heron-<key>.md` or `.json`, the key's characters
    that a file name should not hold replaced."""
    return f"heron-{re.sub(r'[^A-Za-z0-9._-]+', '_', key)}.{SUFFIX[form]}"


# ---- JSON ---------------------------------------------------------------------------------------


def to_json(record: Record) -> str:
    return json.dumps(as_json(record), ensure_ascii=False, indent=2) + "\n"


def as_json(record: Record) -> JSONObject:
    """The export's one object: the conversation, the turns with rows on this branch (numbered
    as `show` numbers them), its messages, the goals set and the questions asked."""
    conv = record.conversation
    on_branch = {row.turn_id for row in record.rows}
    turns: list[JSONValue] = [
        _turn_json(record.numbers[tid], turn)
        for tid, turn in record.turns.items()
        if tid in on_branch
    ]
    return {
        "version": VERSION,
        "key": conv.key,
        "title": conv.title,
        "agent": conv.agent,
        "created": conv.created,
        "updated": conv.updated,
        "turns": turns,
        "messages": [_message_json(row, record) for row in record.rows],
        "goals": [_goal_json(goal) for goal in record.goals_set],
        "questions": _questions_json(record),
        "compactions": [_fold_json(fold) for fold in record.folds],
    }


def _fold_json(fold: Compaction) -> JSONObject:
    return {
        "id": fold.id,
        "kind": fold.kind,
        "reason": fold.reason,
        "created": fold.created,
        "first_message_id": fold.first_row_id,
        "last_message_id": fold.last_row_id,
        "messages_folded": fold.rows_folded,
        "tokens_before": fold.tokens_before,
        "tokens_after": fold.tokens_after,
        "summary": fold.summary,
        "working_state": fold.working_state,
    }


def _turn_json(number: int, turn: Turn) -> JSONObject:
    return {
        "turn": number,
        "run_id": turn.run_id,
        "status": turn.status,
        "model": turn.model,
        "started": turn.started,
        "ended": turn.ended,
        "usage": usage_to_dict(turn.usage),
        # A call stopped mid-reply (/stop, Ctrl-C) before the provider counted it: `usage` is
        # what was counted, not what was billed.
        "usage_unknown": turn.usage_unknown,
        "error": turn.error,
    }


def _message_json(row: StoredMessage, record: Record) -> JSONObject:
    turn = record.numbers.get(row.turn_id) if row.turn_id is not None else None
    return {
        "id": row.id,
        "role": row.role,
        "author": who_wrote(row.message, row.author),
        "kind": row.kind,
        "created": row.created,
        "turn": turn,
        "parts": [part_to_dict(part) for part in row.message.parts],
    }


def _goal_json(goal: goals.Goal) -> JSONObject:
    return {"objective": goal.objective, "status": goal.status, "created": goal.created}


def _questions_json(record: Record) -> list[JSONValue]:
    """Each `ask_user` call on the branch that asked a question: where, what, and the answer."""
    out: list[JSONValue] = []
    asked = Asked(record.questions)
    for row in record.rows:
        for call in row.message.tool_calls:
            run = asked.asking(call, row.created)
            if run is not None:
                answer = run.result if run.status == "answered" else None
                out.append(
                    {
                        "message_id": row.id,
                        "call_id": call.id,
                        "question": run.task,
                        "status": run.status,
                        "answer": answer,
                        "asked": run.created,
                    }
                )
    return out


# ---- Markdown -----------------------------------------------------------------------------------


def to_markdown(record: Record, zone: str) -> str:
    """A readable document: a heading per turn, each message under who wrote it, tool calls and
    results in code fences, questions with their answers, goals where they were set. Its times
    are in `zone`, named once, in the line under the title."""
    conv = record.conversation
    blocks = [f"# {_one_line(conv.title or conv.key)}", _about(record, zone)]
    seen: set[int] = set()
    asked = Asked(record.questions)
    calls: dict[str, str] = {}  # call id -> its tool's name, for the result's heading
    folded_at: dict[int | None, list[Compaction]] = {}
    for fold in record.folds:
        folded_at.setdefault(fold.last_row_id, []).append(fold)
    for item in record.reading():
        if isinstance(item, goals.Goal):
            blocks.append(_quoted(f"**Goal set** ({item.status}): {item.objective}"))
            continue
        tid = item.turn_id
        if tid is not None and tid not in seen and tid in record.turns:
            seen.add(tid)
            blocks.append(_turn_heading(record.numbers[tid], record.turns[tid], zone))
        blocks.extend(_message_md(item, asked, calls, zone))
        blocks.extend(_fold_md(fold, zone) for fold in folded_at.get(item.id, ()))
    return "\n\n".join(blocks) + "\n"


def _fold_md(fold: Compaction, zone: str) -> str:
    """Where a compaction folded the messages above: from here the model read its summary in
    their place (they stay in the record, as above)."""
    when = timefmt.when(fold.created, zone)
    tokens = f"{fold.tokens_before:,} → {fold.tokens_after:,} tokens"
    head = _quoted(
        f"**Folded** ({fold.kind}, {plural(fold.rows_folded, 'message')}, {tokens}, {when}):"
        " from here the model read this summary in place of the messages above"
    )
    return f"{head}\n\n{fenced(fold.summary)}"


def _about(record: Record, zone: str) -> str:
    conv = record.conversation
    started = timefmt.when(conv.created, zone, timefmt.SECOND, named=True)
    active = timefmt.when(conv.updated, zone, timefmt.SECOND, named=True)
    return (
        f"Conversation {_code(conv.key)} · agent {_code(conv.agent)} · started {started} · "
        f"last active {active} · {len(record.rows)} messages on the current branch, each "
        f"whole; attachments are named, not included. Times are in {zone}. Exported by Heron."
    )


def _turn_heading(number: int, turn: Turn, zone: str) -> str:
    model = f" · {_code(turn.model)}" if turn.model else ""
    failed = f" ({_one_line(turn.error)})" if turn.error and turn.status == "failed" else ""
    when = timefmt.when(turn.started, zone, timefmt.SECOND)
    return f"## Turn {number} · {when} · {turn.status}{failed}{model}"


def _message_md(row: StoredMessage, asked: Asked, calls: dict[str, str], zone: str) -> list[str]:
    """The row under a line naming who wrote it; nothing for a row with nothing to show (the
    result of a question, shown with the question)."""
    who = who_wrote(row.message, row.author)
    blocks: list[str] = []
    for part in row.message.parts:
        if isinstance(part, Text) and part.text.strip():
            blocks.append(_closed(part.text))
        elif isinstance(part, Thinking) and part.text:
            blocks.append("*Reasoning:*\n\n" + _quoted(part.text))
        elif isinstance(part, ToolCall):
            blocks.extend(_call_md(part, row.created, asked, calls))
        elif isinstance(part, ToolResult) and part.call_id not in asked.shown:
            name = _code(calls.get(part.call_id, "?"))
            said = "Error from" if part.is_error else "Result of"
            blocks.append(f"{said} {name} ({_code(part.call_id)}):\n\n{fenced(part.content)}")
        elif isinstance(part, File):
            blocks.append(f"{who} attached {_file(part)}")
    if not blocks:
        return []
    when = timefmt.when(row.created, zone, timefmt.SECOND)
    return [f"**{who}** · message {row.id} · {when}", *blocks]


def _call_md(call: ToolCall, created: float, asked: Asked, calls: dict[str, str]) -> list[str]:
    """A tool call with its arguments; an `ask_user` call as its question and the answer."""
    run = asked.asking(call, created)
    if run is None:
        calls[call.id] = call.name
        args = json.dumps(call.args, ensure_ascii=False, indent=2)
        return [f"Tool call {_code(call.name)} ({_code(call.id)}):\n\n{fenced(args, 'json')}"]
    question = "**assistant asks:**\n\n" + _quoted(run.task)
    if run.status == "answered":
        return [question, "**you** answered:\n\n" + _quoted(run.result or "")]
    return [question, f"*(no answer: {run.status})*"]


def _file(part: File) -> str:
    return (
        f"{_code(part.name or 'file')} ({part.media_type}, {size_label(part.size)}, "
        f"sha256 {part.sha256})"
    )


def fenced(text: str, info: str = "") -> str:
    """`text` whole in a code fence longer than any run of backticks in it (three at least),
    so nothing inside can close it early."""
    fence = "`" * max(3, longest_backticks(text) + 1)
    end = "" if text.endswith("\n") else "\n"
    return f"{fence}{info}\n{text}{end}{fence}"


def _code(text: str) -> str:
    """`text` as inline code, whatever backticks it holds (CommonMark: a longer run of
    backticks around it, and a space inside where it starts or ends with one)."""
    ticks = "`" * (longest_backticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _quoted(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines() or [""])


def _one_line(text: str) -> str:
    return " ".join(text.split())


# An opening or closing code fence line (CommonMark: up to three spaces, then three or more
# backticks or tildes).
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def _closed(text: str) -> str:
    """A message's Markdown as written, with a code fence it left open closed at its end: an
    unclosed fence would otherwise swallow the rest of the document."""
    open_fence: str | None = None
    for line in text.splitlines():
        found = _FENCE.match(line)
        if found is None:
            continue
        run, rest = found.group(1), found.group(2)
        if open_fence is None:
            if not (run[0] == "`" and "`" in rest):  # a backtick fence's info has no backtick
                open_fence = run
        elif run[0] == open_fence[0] and len(run) >= len(open_fence) and not rest.strip():
            open_fence = None
    if open_fence is None:
        return text
    return text.rstrip("\n") + "\n" + open_fence
