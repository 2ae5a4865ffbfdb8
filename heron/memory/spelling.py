"""A typed word that no message holds ("Caroleine", "restaurnat") is searched as the nearest
word the history holds, within a small edit distance (`allowance`): recall over words finds
nothing for a typo otherwise. Pure text, no I/O: `Recall.respelled` reads the index's
vocabulary and asks `nearest` here. Only `recall_history`, `heron memory recall` and
`heron conversations search` respell; auto-recall never does (it shows messages unasked, and a
guessed word would bring messages about something else).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SHORTEST = 5  # letters a word needs before a typo of it is guessed at all
LONG = 8  # letters from which two edits are allowed, one below


def allowance(word: str) -> int:
    """How many edits (insert, delete, replace a letter) a word may be from the one searched in
    its place: none for a word under SHORTEST letters or one that holds anything but letters
    (a number, a code: a digit off is another number), 1 up to LONG - 1 letters, 2 from LONG."""
    if len(word) < SHORTEST or not word.isalpha():
        return 0
    return 1 if len(word) < LONG else 2


def nearest(stem: str, vocabulary: Iterable[tuple[str, int]], most: int) -> str | None:
    """The word of `vocabulary` ((word, messages holding it)) nearest to `stem` within `most`
    edits, letters only: the fewest edits, then the most messages, then the first in order;
    None when none is that near.

    An edit inserts, deletes or replaces a letter, or swaps two next to each other (the
    optimal string alignment distance: a swap is the commonest typo). The words are walked in
    order, as a trie: the table's row of a prefix serves every word that starts with it, and a
    prefix already more than `most` edits from every start of `stem` rules out all of them
    (a history's vocabulary is tens of thousands of words; most are ruled out by two letters)."""
    best: tuple[int, int, str] | None = None
    rows = [list(range(len(stem) + 1))]  # rows[i]: the table's row after i letters of `word`
    word_before = ""
    dead: str | None = None  # a prefix too far already
    for word, messages in sorted(vocabulary):
        if dead is not None and word.startswith(dead):
            continue
        dead = None
        if word == stem or not word.isalpha() or abs(len(word) - len(stem)) > most:
            continue
        shared = min(_shared(word, word_before), len(rows) - 1)
        del rows[shared + 1 :]
        word_before = word
        for i in range(shared + 1, len(word) + 1):
            rows.append(_row(rows, word, i, stem))
            if min(rows[i]) > most:
                dead = word[:i]
                break
        else:
            edits = rows[len(word)][len(stem)]
            if edits <= most and (best is None or (edits, -messages, word) < best):
                best = (edits, -messages, word)
    return None if best is None else best[2]


def _shared(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _row(rows: list[list[int]], word: str, i: int, stem: str) -> list[int]:
    """The table's row after `word[:i]`, from the rows before it."""
    previous, letter = rows[i - 1], word[i - 1]
    row = [i]
    for j in range(1, len(stem) + 1):
        edits = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (letter != stem[j - 1]))
        if i > 1 and j > 1 and letter == stem[j - 2] and word[i - 2] == stem[j - 1]:
            edits = min(edits, rows[i - 2][j - 2] + 1)
        row.append(edits)
    return row


def note(respelled: Iterable[tuple[str, str]]) -> str:
    """What a search says it did in place of the words typed: "no message holds 'olivse';
    searched 'olives'" ('' for none)."""
    return "; ".join(f"no message holds {typed!r}; searched {word!r}" for typed, word in respelled)


def replace(query: str, typed: str, word: str) -> str:
    """`query` with the word `typed` (any case, whole) replaced by `word`, capitalised when the
    typed word was (a name stays a name for the query's cue)."""

    def written(found: re.Match[str]) -> str:
        return word[:1].upper() + word[1:] if found.group()[:1].isupper() else word

    return re.sub(rf"(?<![^\W_]){re.escape(typed)}(?![^\W_])", written, query, flags=re.I)
