"""Auto-recall: the messages of the history put in front of the model before a turn, unasked.

Before each user message the engine asks `auto_messages` for hits worth showing. A message is
shown when it

- passes a gate on a score normalised for the history's size: its `share`, the idf-weighted
  share of the query's content words it holds, idf counted among the messages of its scope
  that hold a query word (`shares`), so text added elsewhere cannot move it, unlike a raw
  BM25 score, which grows with the history;
- ranks among the first `Gate.depth` of the same retrieval `heron memory recall` uses
  (`Recall.ranked`: BM25 fused with sentence vectors when the extra is installed), and each
  hit after the first scores at least `Gate.second` of the first one's score;
- is not in the model's view already, nor from before the conversation's /new, nor a message
  that says exactly what was just typed (a retried or repeated message).

A message with fewer than MIN_WORDS content words never fires: one word gives every message
that holds it the same share, so the share cannot tell a hit from noise.

Hits from the conversation itself; other conversations' only when it has none to show (their
search is what costs most at 100,000 messages), above a stricter share (`Gate.other`), and
under a heading that names them as such. The result fits the view's
budget for one recall result and reaches the model as a synthetic `recall_history` call and
result, stored before the user's message (heron/memory/wiring.py), so it is evidence the model
looked up, never instructions, and the cached prefix before it is untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from heron.memory import records
from heron.memory.recall import Hit, Recall, held_by, terms, wants_recall
from heron.messages import Message, ToolCall, ToolResult

CANDIDATES = 200  # messages of a scope that hold a query word, at most, for the idf count
# Matches scored, at most, by a search of the other conversations (Recall.selective_terms):
# bm25() of each match is what such a search costs (about 2 us each, 10 ms for the 6,000 a
# `heron memory recall` scores), and a turn's auto-recall must cost under 10 ms at 100,000
# messages. The rarest words are kept; a word in thousands of messages adds little to a share.
OTHERS_BUDGET = 2_000
MIN_WORDS = 2  # distinct query words a query needs, and a hit must hold
RESULT_CHARS = 1_500  # the result's size when the caller gives no budget of its own
LINE_CHARS = 320  # one hit's line, at most (its snippet is about 300 characters)


@dataclass(frozen=True)
class Gate:
    """The bars of auto-recall. The values are chosen by k-fold validation on the tuning set
    (bench/recall.py --folds, docs/memory.md gives each fold's choice and the spread)."""

    own: float = 0.3  # share a hit of this conversation needs
    other: float = 0.7  # share a hit of another conversation needs
    hits: int = 3  # hits shown at most
    depth: int = 5  # a hit must rank among the first `depth` of the fused retrieval
    second: float = 0.9  # a later hit's fused score, as a share of the first one's, at least


GATE = Gate()


def shares(
    recall: Recall, text: str, conversation_id: int, *, others: bool = False
) -> dict[int, float]:
    """Message id -> share of the query's idf weight it holds, for the messages of the
    conversation (`others`: of every other conversation) that hold at least MIN_WORDS of the
    query's words, other than those that say exactly the query. Exact while fewer than
    CANDIDATES messages of the scope hold a query word. {} for a query of fewer words."""
    words = terms(text)
    if len(words) < MIN_WORDS:
        return {}
    if others:
        found = recall.bm25(text, CANDIDATES, outside=conversation_id, budget=OTHERS_BUDGET)
    else:
        found = recall.bm25(text, CANDIDATES, conversation_id)
    if not found:
        return {}
    ids = [i for i, _ in found]
    bodies = recall.bodies(ids)
    held = dict(zip(ids, held_by([bodies.get(i, "") for i in ids], words), strict=True))
    total = len(held)
    df = {w: sum(1 for h in held.values() if w in h) for w in words}
    idf = {w: math.log(1 + (total - df[w] + 0.5) / (df[w] + 0.5)) for w in words}
    whole = sum(idf.values()) or 1.0
    said = _folded(text)
    return {
        i: sum(idf[w] for w in h) / whole
        for i, h in held.items()
        if len(h) >= MIN_WORDS and not _says(bodies.get(i, ""), said)
    }


def _folded(text: str) -> str:
    return " ".join(text.lower().split())


def _says(body: str, said: str) -> bool:
    """Whether `body` folds to `said` (a folded text). A body that does not hold the first
    word of it cannot, and most do not: the test is only folded for the rest."""
    first = said.split(" ", 1)[0]
    return first in body.lower() and _folded(body) == said


def fires(recall: Recall, text: str, conversation_id: int, gate: Gate = GATE) -> bool:
    """Whether any message passes the share gate (in view or not): the quick question asked
    off the event loop first (wiring.RecallReader); only a yes loads the fused retrieval."""
    if not wants_recall(text):
        return False
    if any(s >= gate.own for s in shares(recall, text, conversation_id).values()):
        return True
    return any(s >= gate.other for s in shares(recall, text, conversation_id, others=True).values())


@dataclass(frozen=True)
class AutoHit:
    hit: Hit
    share: float
    other: bool  # from another conversation than the one asking


def auto_hits(
    recall: Recall,
    text: str,
    conversation_id: int,
    in_view: Iterable[int] | Callable[[], Iterable[int]] = (),
    gate: Gate = GATE,
    since: float = 0.0,
) -> list[AutoHit]:
    """The hits auto-recall shows for `text` typed in `conversation_id`: this conversation's
    (written at `since` or later: the /new floor), or when it has none, other conversations'
    above the stricter bar, each in the order of the fused retrieval. [] when nothing passes (the
    common case: no vector is loaded then). `in_view` may be a function, called only when
    something passes."""
    if not wants_recall(text):
        return []
    own = {i: s for i, s in shares(recall, text, conversation_id).items() if s >= gate.own}
    rest: dict[int, float] | None = None
    if not own:
        rest = shares(recall, text, conversation_id, others=True)
        if not any(s >= gate.other for s in rest.values()):
            return []  # the common case: neither the view nor a vector is loaded
    skip = set(in_view() if callable(in_view) else in_view)
    own = {i: s for i, s in own.items() if i not in skip}
    if own and since > 0:
        dates = records.message_dates(recall.store, list(own))
        own = {i: own[i] for i, _, created in dates if created >= since}
    picked = _in_fused_order(recall, text, conversation_id, own, gate, gate.hits)
    found = [(i, score, own[i], False) for i, score in picked]
    if not found:  # other conversations only when this one has nothing to show
        if rest is None:
            rest = shares(recall, text, conversation_id, others=True)
        other = {i: s for i, s in rest.items() if s >= gate.other and i not in skip}
        more = _in_fused_order(recall, text, None, other, gate, gate.hits)
        found = [(i, score, other[i], True) for i, score in more]
    if not found:
        return []
    by_id = {h.message_id: h for h in recall._hits([(i, s) for i, s, _, _ in found], text)}
    return [AutoHit(by_id[i], share, far) for i, _, share, far in found if i in by_id]


def _in_fused_order(
    recall: Recall,
    text: str,
    conversation_id: int | None,
    allowed: dict[int, float],
    gate: Gate,
    limit: int,
) -> list[tuple[int, float]]:
    """The allowed messages among the fused retrieval's first `gate.depth`, in its order, each
    after the first within `gate.second` of the first one's score."""
    if not allowed or limit <= 0:
        return []
    if conversation_id is None:  # every conversation: as bounded as the others' shares
        ranked = recall.ranked(text, gate.depth, None, OTHERS_BUDGET)
    else:
        ranked = recall.ranked(text, gate.depth, conversation_id)
    kept = [(i, s) for i, s in ranked if i in allowed]
    if not kept:
        return []
    first = kept[0][1]
    bar = first * gate.second if first > 0 else 0.0
    return [kept[0], *[(i, s) for i, s in kept[1:] if s >= bar]][:limit]


def auto_messages(
    recall: Recall,
    text: str,
    conversation_id: int,
    in_view: Iterable[int] | Callable[[], Iterable[int]] = (),
    *,
    max_chars: int = RESULT_CHARS,
    call_id: str = "auto_recall",
    gate: Gate = GATE,
    since: float = 0.0,
) -> list[Message]:
    """The synthetic recall_history call and its result for `text`, or [] when nothing passes.
    The result holds whole hit lines while they fit `max_chars` (at least the first hit,
    cut to fit), this conversation's hits first and other conversations' under their own
    heading; the call names the query as the model would have asked it."""
    found = auto_hits(recall, text, conversation_id, in_view, gate, since)
    if not found:
        return []
    content = render(found, max_chars)
    call = ToolCall(call_id, "recall_history", {"query": text[:200], "limit": len(found)})
    return [Message("assistant", [call]), Message("user", [ToolResult(call_id, content)])]


OTHER_HEADING = "From other conversations (not this one):"


def render(found: Sequence[AutoHit], max_chars: int) -> str:
    """The hit lines, within `max_chars`: this conversation's, then the others' under
    OTHER_HEADING; a line that does not fit is left out (the first is cut to fit instead)."""
    lines: list[str] = []
    used = 0
    heading = False
    for n, item in enumerate(found):
        line = _clip(item.hit.line(), LINE_CHARS)
        extra = [OTHER_HEADING] if item.other and not heading else []
        cost = sum(len(x) + 1 for x in [*extra, line])
        if n and used + cost > max_chars:
            break
        if not n and cost > max_chars:
            line = _clip(line, max(80, max_chars - sum(len(x) + 1 for x in extra)))
        lines += [*extra, line]
        heading = heading or bool(extra)
        used += cost
    return "\n".join(lines)


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def gated_hits(
    recall: Recall,
    text: str,
    conversation_id: int,
    in_view: Iterable[int] = (),
    *,
    min_share: float = GATE.own,
    limit: int = GATE.hits,
) -> list[tuple[int, float]]:
    """(message id, share) of the conversation's messages passing the share gate and not in
    view, best share first, then oldest: the gate alone, without the fused ranking."""
    skip = set(in_view)
    scored = [
        (i, s)
        for i, s in shares(recall, text, conversation_id).items()
        if s >= min_share and i not in skip
    ]
    return sorted(scored, key=lambda kv: (-kv[1], kv[0]))[:limit]
