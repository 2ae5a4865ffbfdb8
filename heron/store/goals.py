"""Store functions of sustained goals (table `goals`, migration m009): at most one open goal
(active or parked) per conversation, with its budget of nudge turns and tokens and what the
runtime block last sent of it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from heron.messages import plural
from heron.store.db import Store

DEFAULT_TURNS = 20  # nudge turns a goal may take before it is parked
DEFAULT_TOKENS = 2_000_000
OPEN = ("active", "parked")


@dataclass(frozen=True)
class Goal:
    id: int
    conversation_key: str
    objective: str
    status: str  # active | parked | done | stopped
    max_turns: int
    max_tokens: int
    turns_used: int
    tokens_used: int
    shown: str | None
    evidence: str | None
    created: float = 0.0  # when it was set (`conversations show` puts it there)

    @property
    def exhausted(self) -> bool:
        return self.turns_used >= self.max_turns or self.tokens_used >= self.max_tokens

    def budget(self) -> str:
        return (
            f"{self.turns_used} of {plural(self.max_turns, 'turn')}, "
            f"{self.tokens_used:,} of {plural(self.max_tokens, 'token')}"
        )


def _goal(r: object) -> Goal:
    return Goal(*(r[k] for k in _COLUMNS))  # type: ignore[index]


_COLUMNS = (
    "id",
    "conversation_key",
    "objective",
    "status",
    "max_turns",
    "max_tokens",
    "turns_used",
    "tokens_used",
    "shown",
    "evidence",
    "created",
)


def open_goal(store: Store, key: str) -> Goal | None:
    """The conversation's goal that is still open (active or parked)."""
    rows = store.query(
        "SELECT * FROM goals WHERE conversation_key = ? AND status IN ('active', 'parked')"
        " ORDER BY id DESC LIMIT 1",
        (key,),
    )
    return _goal(rows[0]) if rows else None


def active_keys(store: Store) -> list[str]:
    """The conversations with an active goal (not parked), oldest goal first."""
    rows = store.query("SELECT conversation_key FROM goals WHERE status = 'active' ORDER BY id")
    return [str(r["conversation_key"]) for r in rows]


def open_keys(store: Store) -> list[str]:
    """The conversations with an open goal, active or parked, oldest goal first."""
    rows = store.query(
        "SELECT conversation_key FROM goals WHERE status IN ('active', 'parked') ORDER BY id"
    )
    return [str(r["conversation_key"]) for r in rows]


def set_goal(
    store: Store,
    key: str,
    objective: str,
    max_turns: int = DEFAULT_TURNS,
    max_tokens: int = DEFAULT_TOKENS,
) -> Goal:
    """A new active goal; an open one is replaced (recorded as stopped)."""
    now = time.time()
    with store.transaction() as c:
        c.execute(
            "UPDATE goals SET status = 'stopped', updated = ? WHERE conversation_key = ?"
            " AND status IN ('active', 'parked')",
            (now, key),
        )
        c.execute(
            "INSERT INTO goals (conversation_key, objective, status, max_turns, max_tokens,"
            " created, updated) VALUES (?, ?, 'active', ?, ?, ?, ?)",
            (key, objective, max_turns, max_tokens, now, now),
        )
    found = open_goal(store, key)
    assert found is not None
    return found


def end_goal(store: Store, key: str, status: str, evidence: str | None = None) -> Goal | None:
    """Close the open goal (done or stopped); the goal as it was, None when there was none."""
    found = open_goal(store, key)
    if found is None:
        return None
    with store.transaction() as c:
        c.execute(
            "UPDATE goals SET status = ?, evidence = ?, updated = ? WHERE id = ?",
            (status, evidence, time.time(), found.id),
        )
    return found


def set_status(store: Store, goal_id: int, status: str) -> None:
    with store.transaction() as c:
        c.execute(
            "UPDATE goals SET status = ?, updated = ? WHERE id = ?", (status, time.time(), goal_id)
        )


def set_budget(store: Store, goal_id: int, max_turns: int, max_tokens: int) -> None:
    """A new budget, counted from now; a parked goal is active again."""
    with store.transaction() as c:
        c.execute(
            "UPDATE goals SET max_turns = ?, max_tokens = ?, turns_used = 0, tokens_used = 0,"
            " status = 'active', updated = ? WHERE id = ?",
            (max_turns, max_tokens, time.time(), goal_id),
        )


def count_turn(store: Store, goal_id: int, tokens: int) -> Goal:
    with store.transaction() as c:
        c.execute(
            "UPDATE goals SET turns_used = turns_used + 1, tokens_used = tokens_used + ?,"
            " updated = ? WHERE id = ?",
            (tokens, time.time(), goal_id),
        )
    rows = store.query("SELECT * FROM goals WHERE id = ?", (goal_id,))
    return _goal(rows[0])


def mark_shown(store: Store, goal_id: int, objective: str) -> None:
    with store.transaction() as c:
        c.execute("UPDATE goals SET shown = ? WHERE id = ?", (objective, goal_id))


def history(store: Store, key: str, limit: int = 5) -> list[Goal]:
    rows = store.query(
        "SELECT * FROM goals WHERE conversation_key = ? ORDER BY id DESC LIMIT ?", (key, limit)
    )
    return [_goal(r) for r in rows]
