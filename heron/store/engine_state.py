"""Store functions of the turn engine: leases, presence, epochs and tool-phase checkpoints.

Each function takes a `Store` and runs one short transaction, so the async engine calls them
inline (`Store.call`). Two processes can never both believe they hold one conversation's lease:
the claim, the commit-time check and the epoch's bump each run in a transaction that first
takes the conversation's lock (`lock_conversation`). On SQLite that is `BEGIN IMMEDIATE`'s one
write lock; on PostgreSQL, whose transactions run side by side, the conversation's row lock, so
a read-then-write there is decided by one process at a time and sees what the last committed.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from heron.messages import Message, Part, Text, ToolResult, parts_from_json, parts_to_json
from heron.store import held
from heron.store.db import Store
from heron.store.pg import later, row_lock

# Named here too, where the readers of leases and runs import them from.
from heron.store.process import HOST as HOST
from heron.store.process import pid_alive as pid_alive

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holder:
    """Who holds a lease or a presence row."""

    owner: str
    host: str
    pid: int
    what: str  # a run id for a lease; "chat" etc. for presence
    expires: float

    @property
    def where(self) -> str:
        """ "process 4242", and the host when it is another machine's."""
        return f"process {self.pid}" + ("" if self.host == HOST else f" on {self.host}")

    def describe(self) -> str:
        return f"{self.what} in {self.where}"


@dataclass(frozen=True)
class Claim:
    """The answer to a lease claim: who holds it instead (None: we do), and, when we do, the
    conversation's epoch and whether an earlier turn left work to recover, read in the same
    transaction so a turn starts with one round trip to the store."""

    holder: Holder | None
    epoch: int = 0
    dirty: bool = False
    # Won from a claim its holder left behind: a process of this host that ended (kill -9)
    # or one whose claim expired. None when nobody held it.
    left_by: Holder | None = None


@dataclass(frozen=True)
class Checkpoint:
    conversation_id: int
    turn_id: int
    epoch: int
    calls: list[str]  # the call ids the last assistant message asked for
    results: list[ToolResult]  # those already finished


def claim_dead(host: str, pid: int, expires: float, now: float) -> bool:
    """A claim is void once expired, or at once when its process on this host is gone."""
    return expires < now or (host == HOST and not pid_alive(pid))


# ---- leases -----------------------------------------------------------------------------------


def lock_conversation(conn: sqlite3.Connection, conversation_id: int) -> None:
    """Inside a write transaction: hold the conversation's lock until it ends. On PostgreSQL
    the row lock, taken by a statement of its own so that the statements after it read what
    the previous holder committed (a statement that waited for a lock still reads the other
    tables as they were when it began); on SQLite `BEGIN IMMEDIATE` holds it already."""
    lock = row_lock(conn)
    if lock:  # its own statement, sent with the next one (`later`)
        later(conn, "SELECT 1 FROM conversations WHERE id = ?" + lock, (conversation_id,))


def try_lease(
    store: Store, conversation_id: int, owner: str, ttl: float, run_id: str | None = None
) -> Claim:
    """Claim the conversation's turn lease."""
    now = time.time()
    with store.transaction() as c:
        lock_conversation(c, conversation_id)
        row = c.execute(
            "SELECT owner, host, pid, run_id, expires FROM turn_leases WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()
        held = None if row is None else Holder(row[0], row[1], row[2], row[3] or "a turn", row[4])
        if (
            held is not None
            and held.owner != owner
            and not claim_dead(held.host, held.pid, row[4], now)
        ):
            return Claim(held)
        later(
            c,
            "INSERT OR REPLACE INTO turn_leases (conversation_id, owner, host, pid, run_id,"
            " acquired, expires) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, owner, HOST, os.getpid(), run_id, now, now + ttl),
        )
        left = held if held is not None and held.owner != owner else None
        return Claim(None, *_epoch_and_dirty(c, conversation_id), left_by=left)


def _epoch_and_dirty(conn: sqlite3.Connection, conversation_id: int) -> tuple[int, bool]:
    """The conversation's epoch, and whether an earlier turn left work to recover: a turn still
    marked running (its process died), a checkpoint left, or a head that is an assistant
    message with calls (`needs_closing`). One statement: every turn starts with it."""
    row = conn.execute(
        "SELECT c.epoch,"
        " EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id AND t.status = 'running'"
        " AND t.kind = 'turn'),"
        " EXISTS (SELECT 1 FROM checkpoints k WHERE k.conversation_id = c.id),"
        " m.role, m.parts LIKE '%\"tool_call\"%'"
        " FROM conversations c LEFT JOIN messages m ON m.id = c.head_id WHERE c.id = ?",
        (conversation_id,),
    ).fetchone()
    if row is None:
        return 0, False
    epoch = row[0] if isinstance(row[0], int) else _epoch_set_right(conn, conversation_id, row[0])
    return epoch, bool(row[1] or row[2] or (row[3] == "assistant" and row[4]))


# What a damaged epoch is set to: no token holds it but a turn begun at 1 and stopped since
# (every stop bumps it), and such a turn is stale already, as every turn was while it was bad.
EPOCH_SET_RIGHT = 1


def _epoch_set_right(conn: sqlite3.Connection, conversation_id: int, value: object) -> int:
    """Under the claim's lock: an epoch that is not a number (SQLite keeps what an outside
    `UPDATE` wrote, 'abc') made every turn of its conversation fail. It only orders stops, so
    it is set to a number, and the log names the row."""
    try:
        return int(str(value))  # '7' written as text: the number it says
    except ValueError:
        pass
    key = _key_of(conn, conversation_id)
    log.warning(
        "conversation %r (row %d of conversations) had a damaged epoch %r, not a number "
        "(written outside Heron); it was set to %d and the conversation goes on",
        key, conversation_id, value, EPOCH_SET_RIGHT,
    )  # fmt: skip
    conn.execute(
        "UPDATE conversations SET epoch = ? WHERE id = ?", (EPOCH_SET_RIGHT, conversation_id)
    )
    return EPOCH_SET_RIGHT


def _key_of(conn: sqlite3.Connection, conversation_id: int) -> str:
    row = conn.execute("SELECT key FROM conversations WHERE id = ?", (conversation_id,))
    found = row.fetchone()
    return str(found[0]) if found else "?"


def renew_lease(store: Store, conversation_id: int, owner: str, ttl: float) -> bool:
    """Push the expiry forward; False when the lease is no longer ours."""
    with store.transaction() as c:
        cur = c.execute(
            "UPDATE turn_leases SET expires = ? WHERE conversation_id = ? AND owner = ?",
            (time.time() + ttl, conversation_id, owner),
        )
    return cur.rowcount == 1


def release_lease(store: Store, conversation_id: int, owner: str) -> None:
    with store.transaction() as c:
        later(
            c,
            "DELETE FROM turn_leases WHERE conversation_id = ? AND owner = ?",
            (conversation_id, owner),
        )


def lease_holder(store: Store, conversation_id: int) -> Holder | None:
    """The live holder of the conversation's turn lease, if any."""
    rows = store.query(
        "SELECT owner, host, pid, run_id, expires FROM turn_leases WHERE conversation_id = ?",
        (conversation_id,),
    )
    if not rows or claim_dead(rows[0][1], rows[0][2], rows[0][4], time.time()):
        return None
    r = rows[0]
    return Holder(r[0], r[1], r[2], r[3] or "a turn", r[4])


def ended_holder(store: Store, conversation_id: int) -> int | None:
    """The pid of this host's process whose claim on the conversation is still stored though
    it has ended (killed mid-turn, no serve to close it): the turn it left `running` runs no
    more, and the next one there closes it. None otherwise (another host's claim: time alone
    never tells it dead)."""
    rows = store.query(
        "SELECT host, pid FROM turn_leases WHERE conversation_id = ?", (conversation_id,)
    )
    if rows and rows[0][0] == HOST and not pid_alive(rows[0][1]):
        return int(rows[0][1])
    return None


def still_current(store: Store, conversation_id: int, epoch: int, owner: str | None) -> bool:
    """The commit-time check: the epoch is unchanged and (when given) the lease is still ours."""
    rows = store.query(
        "SELECT c.epoch, l.owner FROM conversations c"
        " LEFT JOIN turn_leases l ON l.conversation_id = c.id WHERE c.id = ?",
        (conversation_id,),
    )
    if not rows or rows[0][0] != epoch:
        return False
    return owner is None or rows[0][1] == owner


def settle_turn(
    store: Store,
    conversation_id: int,
    epoch: int,
    owner: str,
    *,
    clear_checkpoint: bool,
    finish: Callable[[bool], None] | None = None,
) -> bool:
    """SAVE in one transaction: the commit-time check (`still_current`), the run's last writes
    (`finish`, told whether the turn is still current: a stale turn keeps only its trace) and,
    when it is current, the checkpoint's removal and the lease's release. One commit where
    there were four: a busy engine pays for every commit on its loop. The conversation is
    locked first, so no claim or /stop lands between the check and the writes."""
    with store.transaction() as c:
        lock_conversation(c, conversation_id)
        current = still_current(store, conversation_id, epoch, owner)
        if finish is not None:
            finish(current)
        if not current:
            return False
        if clear_checkpoint:
            later(c, "DELETE FROM checkpoints WHERE conversation_id = ?", (conversation_id,))
        later(
            c,
            "DELETE FROM turn_leases WHERE conversation_id = ? AND owner = ?",
            (conversation_id, owner),
        )
    return True


# ---- turns of other processes ------------------------------------------------------------------


@dataclass(frozen=True)
class HeldLease:
    """A live turn lease as a serve sees it: whose conversation, who holds it, since when."""

    key: str
    conversation_id: int
    holder: Holder
    acquired: float


def live_leases(store: Store) -> list[HeldLease]:
    """Every live turn lease of the home with its conversation's key: what `heron serve` reads
    (once a second while a client is attached) to learn of the turns other processes run. One
    statement on a table of one row per running turn, joined by primary key."""
    now = time.time()
    rows = store.query(
        "SELECT c.key, l.owner, l.host, l.pid, l.run_id, l.expires, l.acquired, c.id"
        " FROM turn_leases l JOIN conversations c ON c.id = l.conversation_id"
    )
    return [
        HeldLease(r[0], r[7], Holder(r[1], r[2], r[3], r[4] or "a turn", r[5]), float(r[6]))
        for r in rows
        if not claim_dead(r[2], r[3], r[5], now)
    ]


@dataclass(frozen=True)
class TurnTold:
    """A turn as a client that could not watch it is told of it once it ended."""

    text: str  # the message that opened it
    reply: str  # the text of its assistant rows, in order
    status: str  # done | failed | interrupted | running (its process died)
    error: str | None


def turns_since(store: Store, key: str, since: float, until: float | None = None) -> list[TurnTold]:
    """The conversation's turns started at or after `since` (a lease's `acquired`, from the
    same process's clock as the turns' `started`) and before `until` (when the next lease was
    claimed: that holder's turns are not these), oldest first."""
    conversation = store.conversation(key)
    if conversation is None:
        return []
    sql = "SELECT id, user_message_id, status, error FROM turns"
    sql += " WHERE conversation_id = ? AND kind = 'turn' AND started >= ?"
    params: tuple[object, ...] = (conversation.id, since)
    if until is not None:
        sql, params = sql + " AND started < ?", (*params, until)
    turns = store.query(sql + " ORDER BY id", params)
    told = []
    for turn_id, opened, status, failed in turns:
        text = store.message(opened).message.text if opened is not None else ""
        rows = store.query(  # the rows after its message, by the (conversation, id) index
            "SELECT id FROM messages WHERE conversation_id = ? AND id > ? AND turn_id = ?"
            " AND role = 'assistant' ORDER BY id",
            (conversation.id, opened or 0, turn_id),
        )
        said = [store.message(row[0]).message.text for row in rows]
        told.append(TurnTold(text, "\n\n".join(s for s in said if s.strip()), status, failed))
    return told


# ---- presence ---------------------------------------------------------------------------------


def enter(store: Store, conversation_id: int, owner: str, what: str, ttl: float) -> None:
    with store.transaction() as c:
        c.execute(
            "INSERT OR REPLACE INTO presence (conversation_id, owner, host, pid, what, expires)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (conversation_id, owner, HOST, os.getpid(), what, time.time() + ttl),
        )


def leave(store: Store, conversation_id: int, owner: str) -> None:
    with store.transaction() as c:
        c.execute(
            "DELETE FROM presence WHERE conversation_id = ? AND owner = ?",
            (conversation_id, owner),
        )


def users(store: Store, conversation_id: int, exclude_pid: int | None = None) -> list[Holder]:
    """Everything still using the conversation: a live turn lease, then live presence rows."""
    now = time.time()
    found: list[Holder] = []
    lease = lease_holder(store, conversation_id)
    if lease is not None:
        found.append(lease)
    rows = store.query(
        "SELECT owner, host, pid, what, expires FROM presence WHERE conversation_id = ?",
        (conversation_id,),
    )
    for r in rows:
        if not claim_dead(r[1], r[2], r[4], now):
            found.append(Holder(r[0], r[1], r[2], r[3], r[4]))
    return [h for h in found if exclude_pid is None or h.pid != exclude_pid]


# ---- epochs -----------------------------------------------------------------------------------


def epoch(store: Store, conversation_id: int) -> int:
    rows = store.query("SELECT epoch FROM conversations WHERE id = ?", (conversation_id,))
    return int(rows[0][0])


def epoch_and_note(store: Store, conversation_id: int) -> tuple[int, str | None]:
    """The conversation's epoch and what the last bump said stopped its turn (None: nothing
    said): what a running turn reads to notice a /stop or /new from another process."""
    rows = store.query(
        "SELECT epoch, stopped_by FROM conversations WHERE id = ?", (conversation_id,)
    )
    return (int(rows[0][0]), rows[0][1]) if rows else (0, None)


def bump_epoch(store: Store, conversation_id: int, by: str | None = None) -> int:
    """Make every turn holding an older token stale; returns the new epoch. `by` says what
    stopped it (`/stop from heron run (process 4242)`), for the process whose turn it was.
    The UPDATE takes the conversation's lock itself: it waits for a claim or a SAVE in
    progress, and theirs for it."""
    with store.transaction() as c:
        c.execute(
            "UPDATE conversations SET epoch = epoch + 1, stopped_by = ? WHERE id = ?",
            (by, conversation_id),
        )
        row = c.execute("SELECT epoch FROM conversations WHERE id = ?", (conversation_id,))
        return int(row.fetchone()[0])


# ---- checkpoints ------------------------------------------------------------------------------


def write_checkpoint(store: Store, cp: Checkpoint, owner: str | None) -> bool:
    """Save the tool phase's progress, unless the turn went stale (then nothing is written)."""
    with store.transaction() as c:
        lock_conversation(c, cp.conversation_id)
        if not still_current(store, cp.conversation_id, cp.epoch, owner):
            return False
        c.execute(
            "INSERT OR REPLACE INTO checkpoints (conversation_id, turn_id, epoch, calls, results,"
            " updated) VALUES (?, ?, ?, ?, ?, ?)",
            (
                cp.conversation_id,
                cp.turn_id,
                cp.epoch,
                json.dumps(cp.calls),
                parts_to_json(list(cp.results)),
                time.time(),
            ),
        )
    return True


def read_checkpoint(store: Store, conversation_id: int) -> Checkpoint | None:
    rows = store.query("SELECT * FROM checkpoints WHERE conversation_id = ?", (conversation_id,))
    if not rows:
        return None
    r = rows[0]
    results = [p for p in parts_from_json(r["results"]) if isinstance(p, ToolResult)]
    return Checkpoint(conversation_id, r["turn_id"], r["epoch"], json.loads(r["calls"]), results)


def clear_checkpoint(store: Store, conversation_id: int) -> None:
    with store.transaction() as c:
        c.execute("DELETE FROM checkpoints WHERE conversation_id = ?", (conversation_id,))


INTERRUPTED = "interrupted: the turn was stopped before this call returned a result"
# Then what the call had printed, when its tool left that (a cell's or a command's output).
PRINTED = "{interrupted}. What it printed before it stopped:\n{printed}"


def needs_closing(store: Store, conversation_id: int) -> bool:
    """Cheap pre-check: a checkpoint is left, or the head is an assistant message with calls."""
    rows = store.query(
        "SELECT m.role, m.parts LIKE '%\"tool_call\"%',"
        " EXISTS (SELECT 1 FROM checkpoints k WHERE k.conversation_id = c.id)"
        " FROM conversations c LEFT JOIN messages m ON m.id = c.head_id WHERE c.id = ?",
        (conversation_id,),
    )
    return bool(rows) and bool(rows[0][2] or (rows[0][0] == "assistant" and rows[0][1]))


def close_dangling_calls(
    store: Store, conversation_id: int, printed: Mapping[str, str] | None = None
) -> int | None:
    """If the branch ends in tool calls left without results (a stop, a crash), append one
    message with the results the checkpoint saved and an 'interrupted' result for the rest
    (with what the call had printed, by call id in `printed`), so the record itself is whole
    again. Returns the new message id, or None when nothing dangled. Runs under the caller's
    lease."""
    with store.transaction():
        conv = store.conversation_by_id(conversation_id)
        cp = read_checkpoint(store, conversation_id)
        head = store.message(conv.head_id) if conv.head_id is not None else None
        if head is None or head.role != "assistant" or not head.message.tool_calls:
            if cp is not None:
                clear_checkpoint(store, conversation_id)
            return None
        saved = {r.call_id: r for r in (cp.results if cp else [])}
        parts: list[Part] = [
            saved.get(call.id) or ToolResult(call.id, interrupted_text(call.id, printed), True)
            for call in head.message.tool_calls
        ]
        stored = store.append(
            conversation_id,
            Message("user", parts),
            turn_id=head.turn_id,
            meta={"restored": "checkpoint" if cp else "interrupted"},
        )
        clear_checkpoint(store, conversation_id)
    return stored.id


def interrupted_text(call_id: str, printed: Mapping[str, str] | None) -> str:
    """The result of a call its turn stopped: that it was interrupted, and what it had printed
    (by call id in `printed`, as the tool left it). The trace records the same text."""
    said = (printed or {}).get(call_id)
    return PRINTED.format(interrupted=INTERRUPTED, printed=said) if said else INTERRUPTED


# ---- turns left open ---------------------------------------------------------------------------


def recover(store: Store, conversation_id: int, stopped: str) -> None:
    """Under the lease: turns still marked running were left by a dead process; close them
    (`close_turn`), and close a tool phase left open."""
    rows = store.query(
        # A maintenance run (/new's memory review, m025) is no turn a dead process left.
        "SELECT id FROM turns WHERE conversation_id = ? AND status = 'running' AND kind = 'turn'",
        (conversation_id,),
    )
    for row in rows:
        close_turn(store, conversation_id, row[0], stopped)
    if needs_closing(store, conversation_id):
        close_dangling_calls(store, conversation_id)


def close_turn(
    store: Store,
    conversation_id: int,
    turn_id: int,
    stopped: str,
    printed: Mapping[str, str] | None = None,
    author: str | None = None,
) -> None:
    """Record an interrupted turn minimally, so the next turn sees the stopped exchange: the
    tool phase closed (a stopped call's result with what it had printed, `printed`), `stopped`
    as the reply to a user message left without one (`author` "model" when it holds what the
    model had streamed, else Heron's), and the turn row marked interrupted (a hard break,
    unless it said otherwise)."""
    with store.transaction() as c:
        close_dangling_calls(store, conversation_id, printed)
        head_id = store.conversation_by_id(conversation_id).head_id
        head = store.message(head_id) if head_id is not None else None
        if head is not None and head.turn_id == turn_id and head.role == "user":
            store.append(
                conversation_id,
                Message("assistant", [Text(stopped)]),
                turn_id=turn_id,
                meta={"interrupted": True},
                author=author,
            )
        c.execute(CLOSE_TURN, (time.time(), turn_id))


# The turn row of a turn nobody finished: interrupted, with the figures its trace recorded (the
# recorder writes each model and tool call as it ends; `finish_turn` would have summed them), so
# `heron conversations show` does not list "0 model calls" above the calls it shows.
_CALLS = "FROM model_calls m WHERE m.turn_id = turns.id"
CLOSE_TURN = (
    "UPDATE turns SET status = 'interrupted', stop_reason = COALESCE(stop_reason, 'break_hard'),"
    " ended = COALESCE(ended, ?),"
    f" model_calls = (SELECT COUNT(*) {_CALLS}),"
    " tool_calls = (SELECT COUNT(*) FROM tool_calls t WHERE t.turn_id = turns.id),"
    f" input_tokens = COALESCE((SELECT SUM(m.input_tokens) {_CALLS}), 0),"
    f" output_tokens = COALESCE((SELECT SUM(m.output_tokens) {_CALLS}), 0),"
    f" cache_read_tokens = COALESCE((SELECT SUM(m.cache_read_tokens) {_CALLS}), 0),"
    f" cache_write_tokens = COALESCE((SELECT SUM(m.cache_write_tokens) {_CALLS}), 0),"
    # a call cut before its usage came (no end, or stopped mid-stream): the tokens are a floor
    " usage_unknown = CASE WHEN EXISTS (SELECT 1 FROM model_calls m WHERE m.turn_id = turns.id"
    " AND (m.ended IS NULL OR m.streamed IS NOT NULL)) THEN 1 ELSE 0 END"
    " WHERE id = ? AND status = 'running'"
)


def close_dead_turns(store: Store, stopped: str, conversation_id: int | None = None) -> list[int]:
    """Turns a process of this host left running when it died mid-turn (a `heron serve`
    killed with kill -9): the conversation's lease is still that process's, so nothing closes
    them until the next turn there claims it (RESTORE). Each is closed now as RESTORE closes
    it (`recover`), the messages the person sent while it ran moved in after it
    (heron/store/held.py), and its lease given up, in one transaction that first takes the
    conversation's lock and checks the lease is still the dead one's. A live holder's turn,
    and another host's (time alone never tells one is dead), are left be. Only that
    conversation's with `conversation_id`. One read of the leases (a row per running turn);
    a write only for one found dead. Returns the ids of the conversations closed."""
    sql = "SELECT conversation_id, owner, pid FROM turn_leases WHERE host = ?"
    args: tuple[object, ...] = (HOST,)
    if conversation_id is not None:
        sql, args = sql + " AND conversation_id = ?", (HOST, conversation_id)
    dead = [(row[0], row[1]) for row in store.query(sql, args) if not pid_alive(row[2])]
    closed = []
    for conversation, owner in dead:
        with store.transaction() as c:
            lock_conversation(c, conversation)
            gone = c.execute(
                "DELETE FROM turn_leases WHERE conversation_id = ? AND owner = ?",
                (conversation, owner),
            )
            if gone.rowcount != 1:  # another claim took it over meanwhile: that one recovers
                continue
            recover(store, conversation, stopped)
            # What the person sent that dead process while its turn ran, after that turn.
            held.move_left(store, store.conversation_by_id(conversation).key, conversation)
        closed.append(conversation)
    return closed


# Why a maintenance run closed by `close_dead_runs` ended, on its row (`trace show`).
DEAD_RUN = "its process ({pid}) ended before the run did: killed or crashed"


def close_dead_runs(store: Store) -> int:
    """Maintenance runs (m025) left `running` by a process of this host that has ended (a
    `kill -9` in the middle of `/compact`): no lease tells they are dead, their row's process
    does (m027). Each is closed interrupted, its figures summed from the calls it recorded and
    its usage unknown (a call in flight as it died was billed, never counted). A run of a
    process on another host is left to that host's processes: time alone never tells one is
    dead. One read of the running rows' partial index; a write only when one is found.
    Returns how many were closed."""
    rows = store.query(
        "SELECT id, pid FROM turns WHERE status = 'running' AND kind <> 'turn' AND host = ?",
        (HOST,),
    )
    dead = [(row[0], row[1]) for row in rows if row[1] is not None and not pid_alive(row[1])]
    if not dead:
        return 0
    sums = "(SELECT COALESCE(SUM({0}), 0) FROM model_calls WHERE turn_id = turns.id)"
    figures = ", ".join(
        f"{column} = {sums.format(column)}"
        for column in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    )
    with store.transaction() as c:
        for turn_id, pid in dead:
            c.execute(
                "UPDATE turns SET status = 'interrupted', stop_reason = 'interrupted',"
                f" error = ?, usage_unknown = 1, {figures}, model_calls ="
                " (SELECT COUNT(*) FROM model_calls WHERE turn_id = turns.id),"
                " ended = COALESCE((SELECT MAX(ended) FROM model_calls WHERE turn_id = turns.id),"
                " started) WHERE id = ? AND status = 'running'",
                (DEAD_RUN.format(pid=pid), turn_id),
            )
    return len(dead)


def close_stale_turn(
    store: Store,
    conversation_id: int,
    turn_id: int,
    owner: str | None,
    stopped: str,
    finish: Callable[[], None],
    printed: Mapping[str, str] | None = None,
    author: str | None = None,
) -> None:
    """SAVE found the turn stale: /stop or /new came from another process after the turn's
    last look at the epoch. In one transaction: while the lease is still the turn's own (only
    the epoch moved), the turn is closed as a stopped one is (`close_turn`: `stopped`, what the
    person saw, as its reply); then `finish` writes the turn row's figures. A turn whose lease
    another process took writes no message: that one holds the record now."""
    with store.transaction() as c:
        lock_conversation(c, conversation_id)
        row = c.execute(
            "SELECT owner FROM turn_leases WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
        if row is not None and row[0] == owner:
            close_turn(store, conversation_id, turn_id, stopped, printed, author)
        finish()


def mark_turn(store: Store, turn_id: int, status: str, stop_reason: str) -> None:
    """Set a turn's status and stop reason, ended now (a turn SAVE found stale)."""
    with store.transaction() as c:
        c.execute(
            "UPDATE turns SET status = ?, stop_reason = ?, ended = ? WHERE id = ?",
            (status, stop_reason, time.time(), turn_id),
        )


@dataclass(frozen=True)
class ClosingNote:
    """What the last turn of a conversation ended with: its last reply's text ("" when it ended
    with none) and when it ended."""

    text: str
    ended: float


def fresh_start(
    store: Store, conversation_id: int, after: int, separator: str
) -> ClosingNote | None:
    """Under the turn's lease, before its message is stored (`TurnOptions.fresh_after`): when
    the conversation holds `after` turns or more since its last separator, write one at its
    head and return how the turn before it ended; None when no separator was due. The lease
    makes the head the end of the last turn, never a row inside a running one."""
    with store.transaction():
        if turns_since_separator(store, conversation_id) < after:
            return None
        note = closing_note(store, conversation_id)
        mark = Message("assistant", [Text(separator)])
        store.append(conversation_id, mark, kind="separator")
    return note


def turns_since_separator(store: Store, conversation_id: int) -> int:
    """Turns whose message came after the conversation's last separator (what its model still
    sees), counted by row ids: a separator and the turn after it may share a timestamp."""
    rows = store.query(
        "SELECT COUNT(*) FROM turns WHERE conversation_id = ? AND kind = 'turn'"
        " AND user_message_id > COALESCE((SELECT MAX(id) FROM messages"
        " WHERE conversation_id = ? AND kind = 'separator'), 0)",
        (conversation_id, conversation_id),
    )
    return int(rows[0][0])


def closing_note(store: Store, conversation_id: int) -> ClosingNote:
    """The last reply with text of the conversation's latest turn, and when that turn ended."""
    turn = store.query(
        "SELECT id, started, ended FROM turns WHERE conversation_id = ? AND kind = 'turn'"
        " ORDER BY id DESC LIMIT 1",
        (conversation_id,),
    )
    if not turn:
        return ClosingNote("", 0.0)
    turn_id, started, ended = int(turn[0][0]), float(turn[0][1]), turn[0][2]
    ids = store.query(
        "SELECT id FROM messages WHERE conversation_id = ? AND turn_id = ? AND role ="
        " 'assistant' AND kind = 'message' ORDER BY id",
        (conversation_id, turn_id),
    )
    replies = store.messages_of(conversation_id, [int(r[0]) for r in ids])
    said = [r.message.text.strip() for r in replies if r.message.text.strip()]
    return ClosingNote(said[-1] if said else "", float(ended) if ended else started)
