"""Auto-recall: the messages of the history put in front of the model before a turn, unasked.

Before each user message the engine asks `auto_messages` for hits worth showing. A message is
shown when it

- passes a gate on a score normalised for the history's size: its `share`, the idf-weighted
  share of the query's content words it holds (and of a number with the word next to it,
  "item 5", when a candidate holds the two together: `numbered`), idf counted among the
  messages of its scope that hold a query word (`shares`), so text added elsewhere cannot
  move it, unlike a raw BM25 score, which grows with the history;
- ranks among the first `Gate.depth` of the same retrieval `heron memory recall` uses
  (`Recall.ranked`: BM25 fused with sentence vectors when the extra is installed), and each
  hit after the first scores at least `Gate.second` of the first one's score;
- is not in the model's view already, nor from before the conversation's /new, nor a message
  that says exactly what was just typed (a retried or repeated message);
- is something the person still stands by: on its conversation's current branch, stating
  nothing they had forgotten since (`Recall.turned_away`); a hit of theirs comes with what
  they wrote later taking it back (`Recall.corrections`).

A message with fewer than MIN_WORDS content words never fires: one word gives every message
that holds it the same share, so the share cannot tell a hit from noise.

Hits from the conversation itself; other conversations' only when it has none to show (their
search is what costs most at 100,000 messages), above a stricter share (`Gate.other`), and
under a heading that names them as such.

A search that cannot fire is not made, with the same hits as when it is (tests/
test_recall_skips.py): the other conversations' when the query's words found there cannot carry
their bar's share (`most_share`: a word said only in this conversation weighs against every
message elsewhere), and the conversation's own when all of it is in view or from before /new
(`own`, worked out by heron/memory/wiring.py). The result fits the view's
budget for one recall result and reaches the model as a synthetic `recall_history` call and
result, stored before the user's message (heron/memory/wiring.py), so it is evidence the model
looked up, never instructions, and the cached prefix before it is untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from heron.memory import records
from heron.memory.codes import has_seam
from heron.memory.recall import Hit, Recall, held_by, search_terms, terms, wants_recall
from heron.messages import Message, ToolCall, ToolResult

CANDIDATES = 200  # messages of a scope that hold a query word, at most, for the idf count
# Matches scored, at most, by a search of the other conversations (Recall.selective_terms):
# bm25() of each match is what such a search costs (about 2 us each, 10 ms for the 6,000 a
# `heron memory recall` scores), and a turn's auto-recall must cost under 10 ms at 100,000
# messages. The rarest words are kept; a word in thousands of messages adds little to a share.
# At 2,000 the search of the others was half of a fired step's time there (p95 over 10 ms);
# at 1,000 an older message of another conversation is left to `recall_history`, which is not
# bounded (the tuning set's figures do not move: its two conversations hold fewer matches).
OTHERS_BUDGET = 1_000
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
    answers: bool = True  # a reply to a passing message that asks passes with its share


GATE = Gate()


def shares(
    recall: Recall,
    text: str,
    conversation_id: int,
    *,
    others: bool = False,
    bar: float = 0.0,
) -> dict[int, float]:
    """Message id -> share of the query's idf weight it holds, for the messages of the
    conversation (`others`: of every other conversation) that hold at least MIN_WORDS of the
    query's words, other than those that say exactly the query. Exact while fewer than
    CANDIDATES messages of the scope hold a query word. {} for a query of fewer words.

    For the other conversations a word counts as held only when the index finds it in one of
    them (`Recall.found_elsewhere`), so a word said only here (a name, the conversation's own
    topic) cannot be held there. That makes their best share known before searching: `bar`
    is the share the caller needs, and when the words found elsewhere cannot reach it
    (`most_share`) the answer is {} without the search, the same answer as after it.

    A number or a code and the word next to it ("item 5": `numbered`) weigh as one more word
    when a candidate holds them together: the rare thing the query asks about, which the
    message that says the number with its word holds and one that holds the words and,
    elsewhere, the number does not. Held by no candidate, such a phrase is left out: not a
    word the person typed, its absence says nothing their words' absence does not."""
    words = terms(text)
    if len(words) < MIN_WORDS:
        return {}
    counted = words
    pairs = numbered(text)
    if others:
        joinable = [p for p in pairs if has_seam(p)]
        elsewhere = set(recall.found_elsewhere(text, conversation_id, OTHERS_BUDGET, joinable))
        # a pair found there holds its words there, written joined or not ("AB1234")
        counted = [w for w in words if w in _with_pairs_words(elsewhere, joinable)]
        pairs = [p for p in pairs if all(w in counted for w in p.split(" "))]
        most = most_share(len(counted) + len(pairs), len(words) + len(pairs))
        if most < bar - SHARE_SLACK:
            return {}
        found = recall.bm25(text, CANDIDATES, outside=conversation_id, budget=OTHERS_BUDGET)
    else:
        found = recall.bm25(text, CANDIDATES, conversation_id)
    if not found:
        return {}
    ids = [i for i, _ in found]
    bodies = recall.bodies(ids)
    holding = held_by([bodies.get(i, "") for i in ids], counted + pairs)
    held = dict(zip(ids, (_with_pairs_words(h, pairs) for h in holding), strict=True))
    total = len(held)
    weighed = words + [p for p in pairs if any(p in h for h in held.values())]
    df = {w: sum(1 for h in held.values() if w in h) for w in weighed}
    idf = {w: math.log(1 + (total - df[w] + 0.5) / (df[w] + 0.5)) for w in weighed}
    whole = sum(idf.values()) or 1.0
    said = _folded(text)
    return {
        i: sum(idf[w] for w in h) / whole
        for i, h in held.items()
        if len(h.difference(pairs)) >= MIN_WORDS and not _says(bodies.get(i, ""), said)
    }


def _with_pairs_words(held: set[str], pairs: Sequence[str]) -> set[str]:
    """`held` with the words of each pair it holds: a message that says "AB1234" says the
    code "AB 1234", whose words the index reads as one (heron/memory/codes.py)."""
    return held.union(*(p.split(" ") for p in pairs if p in held))


def numbered(text: str) -> list[str]:
    """The query's numbers and codes together with the word next to them ("item 5", "pr 88"):
    its search terms that are not its words (`recall.search_terms`)."""
    words = set(terms(text))
    return [t for t in search_terms(text) if t not in words]


# What the bound of `most_share` leaves for the rounding of the shares' sums: a bound equal to
# a bar in exact arithmetic must never skip a search whose share would round to the bar.
SHARE_SLACK = 1e-9


def most_share(held: int, words: int) -> float:
    """The largest share a message can reach when only `held` of the query's `words` words can
    be held in its scope. A share is the held words' idf over all the words' idf, counted among
    at most CANDIDATES candidates: it is largest when each held word has the largest idf a word
    held by some candidate can have (one holder of CANDIDATES) and each other word the idf of a
    word held by none (its least, as every idf, at the most candidates: the ratio of the two
    grows with their number). Below MIN_WORDS held words no message can be a hit at all."""
    if held < MIN_WORDS:
        return 0.0
    if held >= words:
        return 1.0
    most_held = math.log(1 + (CANDIDATES - 1 + 0.5) / (1 + 0.5))
    unheld = math.log(1 + (CANDIDATES + 0.5) / 0.5)
    return held * most_held / (held * most_held + (words - held) * unheld)


def _folded(text: str) -> str:
    return " ".join(text.lower().split())


def _says(body: str, said: str) -> bool:
    """Whether `body` folds to `said` (a folded text). A body that does not hold the first
    word of it cannot, and most do not: the test is only folded for the rest."""
    first = said.split(" ", 1)[0]
    return first in body.lower() and _folded(body) == said


def fires(
    recall: Recall, text: str, conversation_id: int, gate: Gate = GATE, own: bool = True
) -> bool:
    """Whether any message passes the share gate (in view or not): the quick question asked
    off the event loop first (wiring.RecallReader); only a yes loads the fused retrieval.
    `own` False: the conversation has nothing to show (see `auto_hits`), only the others
    are searched."""
    if not wants_recall(text):
        return False
    with recall.one_look():
        if own and any(s >= gate.own for s in shares(recall, text, conversation_id).values()):
            return True
        rest = shares(recall, text, conversation_id, others=True, bar=gate.other)
        return any(s >= gate.other for s in rest.values())


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
    own: bool = True,
    branch: Iterable[int] | Callable[[], Iterable[int]] | None = None,
) -> list[AutoHit]:
    """The hits auto-recall shows for `text` typed in `conversation_id`: this conversation's
    (written at `since` or later: the /new floor; on the current `branch` when given: what
    /retry, /edit or /tree left on another branch the person turned away from), or when it has
    none, other conversations' above the stricter bar, each in the order of the fused
    retrieval. [] when nothing passes (the common case: no vector is loaded then). `in_view`
    and `branch` may be functions, called only when something passes. `own` False says that
    every message of the conversation written at `since` or later is in view
    (wiring.unseen_own): none of them could be shown, so the conversation's own search is
    skipped, with the same hits."""
    if not wants_recall(text):
        return []
    with recall.one_look():  # the searches' stamp read once for all of them
        return _auto_hits(recall, text, conversation_id, in_view, gate, since, own, branch)


def _auto_hits(
    recall: Recall,
    text: str,
    conversation_id: int,
    in_view: Iterable[int] | Callable[[], Iterable[int]],
    gate: Gate,
    since: float,
    own: bool,
    branch: Iterable[int] | Callable[[], Iterable[int]] | None = None,
) -> list[AutoHit]:
    mine = shares(recall, text, conversation_id) if own else {}
    own_hits = _answered(recall, {i: s for i, s in mine.items() if s >= gate.own}, gate)
    rest: dict[int, float] | None = None
    if not own_hits:
        rest = shares(recall, text, conversation_id, others=True, bar=gate.other)
        if not any(s >= gate.other for s in rest.values()):
            return []  # the common case: neither the view nor a vector is loaded
    skip = set(in_view() if callable(in_view) else in_view)
    own_hits = {i: s for i, s in own_hits.items() if i not in skip}
    if own_hits and branch is not None:
        on = set(branch() if callable(branch) else branch)
        own_hits = {i: s for i, s in own_hits.items() if i in on}
    if own_hits and since > 0:
        dates = records.message_dates(recall.store, list(own_hits))
        own_hits = {i: own_hits[i] for i, _, created in dates if created >= since}
    # the branch as the engine holds it, when given, is checked above
    own_standing = recall.turned_away if branch is None else recall.revoked
    picked = _in_fused_order(recall, text, conversation_id, own_hits, gate, gate.hits, own_standing)
    found = [(i, score, own_hits[i], False) for i, score in picked]
    pool: Iterable[int] = mine
    if not found:  # other conversations only when this one has nothing to show
        if rest is None:
            rest = shares(recall, text, conversation_id, others=True, bar=gate.other)
        other = _answered(recall, {i: s for i, s in rest.items() if s >= gate.other}, gate)
        other = {i: s for i, s in other.items() if i not in skip}
        more = _in_fused_order(recall, text, None, other, gate, gate.hits, recall.turned_away)
        found = [(i, score, other[i], True) for i, score in more]
        pool = rest
    if not found:
        return []
    hits = recall._hits([(i, s) for i, s, _, _ in found], text)
    by_id = {h.message_id: h for h in recall.corrections(hits, text, list(pool))}
    return [AutoHit(by_id[i], share, far) for i, _, share, far in found if i in by_id]


def _answered(recall: Recall, passed: dict[int, float], gate: Gate) -> dict[int, float]:
    """`passed` and, with `gate.answers`, the replies to those of them that ask (hold a "?"),
    each with the share of the message it answers where that is higher than its own. An
    answer seldom repeats the words of its question ("How long have you been married?" "5
    years already!"), so the gate's lexical share cannot see it, but the question it answers
    holds them; a reply to a message that only says the same words gains nothing (k-fold
    check: bench/recall.py --folds, docs/memory.md)."""
    if not passed or not gate.answers:
        return passed
    links = records.parent_links(recall.store, list(passed))
    replies = [(child, parent) for child, parent in links if parent in passed]
    if not replies:
        return passed
    asking = {i for i, body in recall.bodies(list({p for _, p in replies})).items() if "?" in body}
    out = dict(passed)
    for child, parent in replies:
        if parent in asking and passed[parent] > out.get(child, 0.0):
            out[child] = passed[parent]
    return out


def _in_fused_order(
    recall: Recall,
    text: str,
    conversation_id: int | None,
    allowed: dict[int, float],
    gate: Gate,
    limit: int,
    away: Callable[[list[int]], set[int]] | None = None,
) -> list[tuple[int, float]]:
    """The allowed messages among the fused retrieval's first `gate.depth`, in its order, each
    after the first within `gate.second` of the first one's score; less, when given, those
    `away` names (what the person turned away from: `Recall.turned_away`). Asked in order of
    each message that could still be picked (the first, then those within the bar, until
    `limit`), it gives what asking it of every allowed message first would, far cheaper: the
    other conversations' allowed messages can be in a hundred conversations, and each look
    walks a branch."""
    if not allowed or limit <= 0:
        return []
    if conversation_id is None:  # every conversation: as bounded as the others' shares
        ranked = recall.ranked(text, gate.depth, None, OTHERS_BUDGET, by_day=False)
    else:
        ranked = recall.ranked(text, gate.depth, conversation_id, by_day=False)
    picked: list[tuple[int, float]] = []
    bar = 0.0
    for i, s in ranked:
        if i not in allowed or (picked and s < bar):
            continue
        if away is not None and i in away([i]):
            continue
        if not picked:
            bar = s * gate.second if s > 0 else 0.0
        picked.append((i, s))
        if len(picked) >= limit:
            break
    return picked


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
    own: bool = True,
    branch: Iterable[int] | Callable[[], Iterable[int]] | None = None,
) -> list[Message]:
    """The synthetic recall_history call and its result for `text`, or [] when nothing passes.
    The result holds whole hit lines while they fit `max_chars` (at least the first hit,
    cut to fit), this conversation's hits first and other conversations' under their own
    heading; the call names the query as the model would have asked it."""
    found = auto_hits(recall, text, conversation_id, in_view, gate, since, own, branch)
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
        line, *later = (_clip(x, LINE_CHARS) for x in item.hit.lines())
        extra = [OTHER_HEADING] if item.other and not heading else []
        cost = sum(len(x) + 1 for x in [*extra, line, *later])
        if n and used + cost > max_chars:
            break
        if not n and cost > max_chars:  # the first hit is cut to fit, its correction kept
            room = max_chars - sum(len(x) + 1 for x in [*extra, *later])
            line = _clip(line, max(80, room))
        lines += [*extra, line, *later]
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
