"""The store's rows as typed records (conversations, stored messages, turns) and who wrote a
message (`author_for`): what every layer above reads, kept free of SQL and of the database."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from heron.messages import Message, Usage

# Conversations Heron keeps for itself (scheduled monitors, the heartbeat, subagents, the
# nightly review's tidy pass of memory as a whole, heron/proactive/review.py): never
# listed to the person (conversations list, /resume, the browser). `is_internal` and the SQL
# of Store.conversations both read these, so the rule lives here only.
INTERNAL_PREFIXES = ("cron:", "subagent:")
INTERNAL_KEYS = ("heartbeat", "memory-review")
# A `turns` row's kind (migration m025): a turn, or a maintenance run, the model calls Heron
# makes outside any turn (heron/agent/maintenance.py, docs/traces.md).
TURN = "turn"
COMPACT = "compact"  # /compact
IDLE_COMPACT = "idle-compact"  # the idle sweeper's consolidation
LEARN = "learn"  # /learn, /reflect: the review and tidy passes
CLOSE_REVIEW = "close-review"  # the review pass `heron chat` starts as it closes
NEW_REVIEW = "new-review"  # the review pass /new starts in the background
NIGHTLY_REVIEW = "nightly-review"  # the nightly review's pass over one conversation
NIGHTLY_TIDY = "nightly-tidy"  # its tidy pass over memory as a whole (in `memory-review`)


def stored_time(value: object) -> float:
    """A stored time in seconds. One that is not a number (a row edited by hand: SQLite keeps
    any value a column is given) reads as 0, the epoch, so every reader (export, search,
    recall, the transcript) shows the row instead of failing on it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return 0.0


def is_internal(key: str) -> bool:
    return key in INTERNAL_KEYS or key.startswith(INTERNAL_PREFIXES)


def internal_sql(column: str = "key") -> tuple[str, tuple[str, ...]]:
    """A WHERE clause (and its parameters) true exactly where `is_internal` is (substr, not
    LIKE: LIKE ignores case and treats _ as a wildcard)."""
    starts = " OR ".join(f"substr({column}, 1, {len(p)}) = ?" for p in INTERNAL_PREFIXES)
    keys = ", ".join("?" for _ in INTERNAL_KEYS)
    return f"({starts} OR {column} IN ({keys}))", INTERNAL_PREFIXES + INTERNAL_KEYS


@dataclass(frozen=True)
class Conversation:
    id: int
    key: str
    agent: str
    title: str | None
    head_id: int | None
    epoch: int
    created: float
    updated: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: int
    parent_id: int | None
    turn_id: int | None
    kind: str
    message: Message
    sent: Message | None
    created: float
    meta: dict[str, Any] = field(default_factory=dict)
    # user | model | tool | heron (heron/store/migrations/m007_author.py); None: not known.
    author: str | None = None

    @property
    def role(self) -> str:
        return self.message.role

    @property
    def wire(self) -> Message:
        """What the model was sent for this row (the runtime block included)."""
        return self.sent or self.message


# What ask_user returns when the person answers (heron/proactive/ask.py): the answer is the
# person's words, though it is stored as the call's result (the full-text index holds it too,
# heron/store/migrations/m024_answers_indexed.py).
ANSWERED = "The user answered: "
ASK_TOOL = "ask_user"

RECALL_FLAG = "recall"  # meta flag of auto-recall's rows (heron/memory/wiring.py)

# Meta flags of rows Heron wrote itself, whatever their role.
SYNTHETIC_FLAGS = (
    "synthetic",
    "injected",
    "injected_event",
    RECALL_FLAG,
    "summary",
    "subagent",
    "interrupted",
)


def author_for(message: Message, kind: str, meta: dict[str, Any] | None) -> str:
    """Who wrote a row about to be stored: a message may say so itself (an `author` attribute:
    the runner's own prompts), else its role, kind and meta flags tell."""
    if message.author is not None:
        return message.author
    if kind != "message" or any((meta or {}).get(flag) for flag in SYNTHETIC_FLAGS):
        return "heron"  # a separator, a summary, a recall injection, a stopped-turn note
    if message.role == "assistant":
        return "model"
    if message.tool_results:
        return "tool"
    return "user"


def shown_as(role: str, author: str | None, results_only: bool = False) -> str:
    """Who a row is shown to the person as (`conversations show`, `export`, `search`): 'heron'
    for a row Heron wrote itself (a continue or wrap-up prompt, a summary, a separator), never
    'you'; 'tool' for a row that carries only tool results; else 'you' or 'assistant' by its
    role."""
    if author == "heron":
        return "heron"
    if role == "assistant":
        return "assistant"
    return "tool" if results_only else "you"


@dataclass(frozen=True)
class Turn:
    id: int
    conversation_id: int
    run_id: str
    user_message_id: int | None
    status: str
    stop_reason: str | None
    provider: str | None
    model: str | None
    usage: Usage
    model_calls: int
    tool_calls: int
    system_fingerprint: str | None
    error: str | None
    started: float
    ended: float | None
    usage_unknown: bool = False  # a model call was stopped before the provider said its usage
    # `turn`, or what Heron ran outside any turn (migration m025: compact, idle-compact, ...)
    kind: str = "turn"

    @property
    def maintenance(self) -> bool:
        """A run Heron made outside any turn (/compact, a memory review): counted in usage
        and traces, never as one of the conversation's turns."""
        return self.kind != TURN
