"""The visible layer of a conversation, built from the store for the browser.

A transcript is what the person sees of the current branch: their messages (with attachments,
and mail typed while the agent worked marked as such), the agent's replies as ordered segments
(reasoning, text, tool pills with full arguments and result), `/new` separators and the notes
Heron wrote itself. Tool results travel in user rows in the record; here each is folded into
the pill of its call, as the live stream shows it; an `ask_user` call is shown as its question
and the person's answer, read from the question's row (heron/store/runs.py), not its text.
A turn that failed stores no reply, only its turn row's status and error: its note (what the
person was told, `The turn failed: ...; send /retry`, or for a turn Heron opened, when it runs
again: `turn.failed_note`) is placed after that turn's last item.
Consecutive assistant rows of one turn (a tool loop) form one reply block, so a reload shows
exactly what the stream built.

A long branch is read in pages (`Page`): the newest items first, earlier ones as the reader
scrolls up. A page decodes only its own rows; where it starts and the numbers of the person's
messages (counted over the whole branch, as `/edit N` takes them) come from the branch's rows
without their parts (`Store.branch_index`), so a 20,000-message conversation is never decoded
whole to show its end.

Pure reads of committed rows; the same rows always give the same transcript.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from typing import Any

from heron.agent.control import mail_channel, unlabelled
from heron.agent.relay import said_by
from heron.agent.turn import REPLY_STOPPED, STOPPED, failed_note
from heron.attachments import inline_files
from heron.messages import File, Text, Thinking, ToolCall, ToolResult
from heron.store import BranchRow, Store, StoredMessage, Turn, runs


@dataclass
class Segment:
    # text | reasoning | tool | note (Heron's, inside a reply) | question (ask_user's, where its
    # call is) | answer (the person's answer to it)
    kind: str
    text: str = ""
    call_id: str | None = None
    name: str | None = None
    args: dict[str, Any] | None = None
    result: str | None = None
    is_error: bool = False


@dataclass
class Attachment:
    name: str
    mime: str
    size: int
    url: str  # where the browser fetches its bytes (GET, same origin)
    # A text file the model got inline, in the message's text (heron/attachments.py
    # `compose`): shown as an attachment whose text opens in place, not as that fenced text.
    inline: bool = False


@dataclass
class Item:
    kind: str  # user | assistant | separator | note
    id: int  # the first stored row it shows
    turn: int | None = None  # the stored turn id
    turn_message: int | None = None  # the user message that opened that turn
    text: str = ""
    mail: bool = False
    mail_from: str | None = None  # mail's channel, when not that of its turn's message
    files: list[Attachment] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # every stored row the item shows
    # Part of a turn still running: a client replaying that turn from the serve's journal
    # shows the stream instead (docs/web.md, "Resuming").
    running: bool = False
    # A user message's number on this branch: what `/edit N TEXT` takes (as /tree lists them).
    number: int | None = None
    # A note saying the turn failed: it shows no stored row of its own (`rows` is empty; `id`
    # is the row it follows), read from the turn's status.
    failed: bool = False
    # A note of background work kept here (a monitor's or the heartbeat's message, a goal's
    # note): who said it, shown with it (heron/agent/relay.py).
    by: str | None = None
    # Mail stored in the row of a tool phase's results (`_mail_with_results`): the part of
    # that row it is. Such mail has no number (it is not a message `/edit N` can take).
    part: int | None = None


@dataclass
class Transcript:
    conversation: str
    title: str | None
    head_id: int | None
    items: list[Item]
    # Paged (`Page`): the first stored row this page shows (None: the branch is empty), and
    # what to pass as `before` for the page before it (None: this one begins the branch).
    start: int | None = None
    earlier: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Page:
    """Which part of the branch to read: the newest `limit` items (about: a turn is never
    cut, so a page starts where a turn does) above row `before` (None: up to the head), or
    with `since` every item from that row on (a page's `start`: the pages a reader holds,
    read again). A `since` that is no longer on the branch (an /edit or /tree below it) reads
    the newest page instead: its `start` then differs from `since`."""

    limit: int | None = None
    before: int | None = None
    since: int | None = None


FILE_URL = "/api/conversations/{key}/files/{id}/{n}"


def build(
    store: Store, key: str, file_url: str = FILE_URL, page: Page | None = None
) -> Transcript | None:
    """The transcript of conversation `key` (None when there is none): the whole branch, or
    the part `page` names. A page decodes only its own rows; the rest of the branch is read
    as `Store.branch_index` reads it (no parts), for where the page starts and the numbers of
    the person's messages, which count over the whole branch."""
    conv = store.conversation(key)
    if conv is None:
        return None
    if page is None:
        rows = store.branch(conv.id)
        turns = {t.id: t for t in store.turns(conv.id)}
        numbers = None
        start, earlier = (rows[0].id if rows else None), None
    else:
        index = store.branch_index(conv.id)
        lo, hi = _window(index, page)
        shown = index[lo:hi]
        rows = store.messages_of(conv.id, [r.id for r in shown])
        turns = {t.id: t for t in _turns_of(store, conv.id, shown)}
        numbers = _numbers(index)
        start = shown[0].id if shown else None
        earlier = start if lo > 0 else None
    items = _items(rows, turns, _Reading({}, runs.questions(store, key), key, file_url))
    users = [i for i in items if i.kind == "user" and i.part is None]
    for n, item in enumerate(users, 1):
        item.number = n if numbers is None else numbers.get(item.id)
    return Transcript(conv.key, conv.title, conv.head_id, items, start, earlier)


def _items(rows: list[StoredMessage], turns: dict[int, Turn], reading: _Reading) -> list[Item]:
    items: list[Item] = []
    for row in rows:
        turn = turns.get(row.turn_id) if row.turn_id else None
        before = len(items)
        _add(items, reading, row, turn.user_message_id if turn else None)
        if turn is not None and turn.status == "running":
            for item in items[before:] or items[-1:]:
                item.running = True
    opened = {row.id: row for row in rows}
    for turn in turns.values():
        opening = opened.get(turn.user_message_id or -1)
        if turn.status == "failed" and turn.error and not _of_a_job(opening):
            note = _failed_note(turn, opening)
            _failed(items, turn.id, turn.user_message_id, note)
    return items


def _of_a_job(message: StoredMessage | None) -> bool:
    """Whether a scheduled job's run opened the turn: its failure is not shown on the turn; the
    scheduler's note, kept in the conversation once per failing streak, says it."""
    return message is not None and message.author == "heron" and "job" in message.meta


def _failed_note(turn: Turn, message: StoredMessage | None) -> str:
    """What the person was told when `turn` failed, as its opening `message` says who opened
    it: a turn Heron opened (a goal's nudge) is not a message of theirs to /retry."""
    assert turn.error is not None
    if message is None or message.author != "heron":
        return failed_note(turn.error)
    opened = str(message.meta.get("injected_event") or "heron")
    return failed_note(turn.error, opened)


def _turns_of(store: Store, conversation_id: int, rows: list[BranchRow]) -> list[Turn]:
    """The turns the rows of a page belong to, and those that opened on one of its messages
    (a failed /retry stores no row: its note follows its message's)."""
    if not rows:
        return []
    ids = [r.turn_id for r in rows if r.turn_id is not None]
    turns = (min(ids), max(ids)) if ids else (0, -1)
    return store.turns_between(conversation_id, turns, (rows[0].id, rows[-1].id))


def _is_user(row: BranchRow) -> bool:
    """A row the transcript shows as the person's message (`_add`'s rule, without the parts:
    tool results are the `tool` author's, Heron's own rows the `heron` author's)."""
    return row.kind == "message" and row.role == "user" and row.author not in ("heron", "tool")


def _numbers(index: list[BranchRow]) -> dict[int, int]:
    """Each of the person's messages on the branch, numbered as `/edit N` and /tree take them."""
    users = (r.id for r in index if _is_user(r))
    return {row_id: n for n, row_id in enumerate(users, 1)}


def _starts(index: list[BranchRow]) -> list[int]:
    """The positions in `index` where a turn's rows begin (a row outside any turn is one by
    itself): a page starts at one, so a turn's reply, tool results and failure note are
    never split between two pages. A /retry's turn goes with the message it answers."""
    out: list[int] = []
    last: object = None
    for n, row in enumerate(index):
        group = row.turn_message if row.turn_message is not None else ("row", row.id)
        if group != last:
            out.append(n)
        last = group
    return out


def _window(index: list[BranchRow], page: Page) -> tuple[int, int]:
    """The slice of `index` that `page` shows."""
    ids = [r.id for r in index]
    if page.since is not None:
        at = bisect_left(ids, page.since)
        if at < len(ids) and ids[at] == page.since and page.before is None:
            return at, len(ids)
    hi = len(ids) if page.before is None else bisect_left(ids, page.before)
    if page.limit is None:
        return 0, hi
    starts = [n for n in _starts(index) if n < hi]
    counted, end = 0, hi
    for at in reversed(starts):
        counted += _items_in(index[at:end])
        end = at
        if counted >= page.limit:
            return at, hi
    return 0, hi


def _items_in(rows: list[BranchRow]) -> int:
    """About how many items `rows` make (`_add`'s rule without the parts): each row is one,
    but tool results, and a model's row that goes on the reply before it."""
    count, reply = 0, None
    for row in rows:
        if row.author == "tool":
            continue
        if row.role == "assistant" and row.kind == "message" and reply == row.turn_id:
            continue
        count += 1
        is_reply = row.role == "assistant" and row.kind == "message"
        reply = row.turn_id if is_reply else None
    return count


def _failed(items: list[Item], turn: int, message: int | None, note: str) -> None:
    """The failure note of `turn` after its last item on this branch (a turn that stored no
    row of its own, a failed /retry, goes after its message's); none when it is off the branch."""
    at = [n for n, it in enumerate(items) if it.turn == turn]
    if not at and message is not None:  # its message, and the earlier turns' items after it
        at = [
            n
            for n, it in enumerate(items)
            if it.turn_message == message and it.turn is not None and it.turn < turn
        ]
    if not at:
        return
    anchor = items[at[-1]]
    items.insert(at[-1] + 1, Item("note", anchor.id, turn, message, note, failed=True))


@dataclass
class _Reading:
    """What a build carries from row to row."""

    calls: dict[str, Segment]  # each tool call's segment, for its result to fill
    questions: runs.Questions  # what ask_user asked here, and the answers
    key: str
    file_url: str


# What a question that got no answer says in its place (runs.status of an `ask` run).
UNANSWERED = {
    "expired": "No answer came before the question's deadline.",
    "cancelled": "You dropped the question.",
    "interrupted": "The turn ended before an answer came.",
}


def _add(
    items: list[Item], reading: _Reading, row: StoredMessage, turn_message: int | None
) -> None:
    calls = reading.calls
    message = row.message
    if row.kind == "separator":
        items.append(
            Item("separator", row.id, row.turn_id, turn_message, message.text, rows=[row.id])
        )
        return
    results = message.tool_results
    if results:  # tool results: into the pills of their calls
        for r in results:
            _fill(calls, r)
        if items and items[-1].kind == "assistant":
            items[-1].rows.append(row.id)
        items.extend(_mail_with_results(row, turn_message))
        return
    partial = _stopped_reply(row)
    if partial is not None:  # what streamed before /stop: the reply as the person read it
        last = _reply(items, row, turn_message)
        _segment(last, reading, row, Text(partial))
        last.segments.append(Segment("note", REPLY_STOPPED.strip("[]")))
        return
    if row.author == "heron" or row.kind != "message":
        by = said_by(row.meta)
        # The model reads Heron's marker in brackets; the person reads a note without them.
        said = STOPPED.strip("[]") if message.text == STOPPED else message.text
        items.append(Item("note", row.id, row.turn_id, turn_message, said, rows=[row.id], by=by))
        return
    if message.role == "user":
        items.append(_user(row, turn_message, reading.key, reading.file_url))
        return
    last = _reply(items, row, turn_message)
    for part in message.parts:
        _segment(last, reading, row, part)


def _reply(items: list[Item], row: StoredMessage, turn_message: int | None) -> Item:
    """The reply block `row` belongs to: the turn's open one, else a new one."""
    last = items[-1] if items else None
    if last is None or last.kind != "assistant" or last.turn != row.turn_id:
        last = Item("assistant", row.id, row.turn_id, turn_message)
        items.append(last)
    last.rows.append(row.id)
    return last


def _stopped_reply(row: StoredMessage) -> str | None:
    """The streamed part of a reply the person stopped (stored by Heron with its marker after
    it, heron/agent/turn.py `interrupted`); None for any other row."""
    text = row.message.text
    if row.role != "assistant" or not row.meta.get("interrupted"):
        return None
    if not text.endswith(REPLY_STOPPED) or text == REPLY_STOPPED:
        return None
    return text.removesuffix(REPLY_STOPPED).rstrip()


def _mail_with_results(row: StoredMessage, turn_message: int | None) -> list[Item]:
    """What the person typed while the tools ran: the runner stores it in the row of their
    results (heron/agent/runner.py `_run_tools`), one text part a message, so that the history
    alternates user and assistant. Shown as their mail after the pills, where the reply that
    follows answers it. It is no message of its own: `/edit N` does not count it (`part`)."""
    items = []
    for n, part in enumerate(row.message.parts):
        if not isinstance(part, Text) or not part.text.strip():
            continue
        said = unlabelled(part.text)
        text = part.text if said is None else said
        mail = Item("user", row.id, row.turn_id, turn_message, text, rows=[row.id], part=n)
        mail.mail, mail.mail_from = said is not None, mail_channel(part.text)
        items.append(mail)
    return items


def _user(row: StoredMessage, turn_message: int | None, key: str, file_url: str) -> Item:
    inline = inline_files(row.message, row.meta)
    parts = row.message.parts
    text = "".join(p.text for n, p in enumerate(parts) if isinstance(p, Text) and n not in inline)
    said = unlabelled(text)  # mail, labelled as heron/agent/control.py labels it
    item = Item(
        "user",
        row.id,
        row.turn_id,
        turn_message,
        text if said is None else said,
        mail=said is not None,
        mail_from=mail_channel(text),
        rows=[row.id],
    )
    for n, part in enumerate(parts):
        url = file_url.format(key=key, id=row.id, n=n)
        if isinstance(part, File):
            item.files.append(Attachment(part.name or "file", part.media_type, part.size, url))
        elif n in inline:
            file = inline[n]
            item.files.append(
                Attachment(file.name or "file", file.media_type, file.size, url, True)
            )
    return item


def _segment(item: Item, reading: _Reading, row: StoredMessage, part: Any) -> None:
    last = item.segments[-1] if item.segments else None
    if isinstance(part, Text) and part.text:
        if last is not None and last.kind == "text":
            last.text += part.text
        else:
            item.segments.append(Segment("text", part.text))
    elif isinstance(part, Thinking) and part.text:
        item.segments.append(Segment("reasoning", part.text))
    elif isinstance(part, ToolCall):
        seg = Segment("tool", call_id=part.id, name=part.name, args=dict(part.args))
        reading.calls[part.id] = seg
        asked = reading.questions.of(part.id, row.created) if part.name == "ask_user" else None
        if asked is None:
            item.segments.append(seg)
            return
        # The question and what came of it, as the live stream showed them.
        seg.kind, seg.text = "question", asked.task
        item.segments.append(seg)
        if asked.status == "answered":
            item.segments.append(Segment("answer", asked.result or ""))
        elif asked.status in UNANSWERED:
            item.segments.append(Segment("note", UNANSWERED[asked.status]))


def _fill(calls: dict[str, Segment], result: ToolResult) -> None:
    seg = calls.get(result.call_id)
    if seg is not None:
        seg.result = result.content
        seg.is_error = result.is_error


def file_part(store: Store, key: str, message_id: int, index: int) -> File | None:
    """The attachment `index` of message `message_id` with its bytes, when it belongs to
    conversation `key` (None too when its bytes are no longer kept)."""
    conv = store.conversation(key)
    if conv is None:
        return None
    try:
        row = store.message(message_id)
    except Exception:  # no such row: the store raises its own error
        return None
    if row.conversation_id != conv.id or not 0 <= index < len(row.message.parts):
        return None
    part = row.message.parts[index]
    if isinstance(part, Text):  # a text file the model got inline
        return inline_files(row.message, row.meta).get(index)
    if not isinstance(part, File):
        return None
    loaded = store.files.load(part)  # the row names the bytes; the store's folder has them
    return loaded if loaded.data is not None else None
