"""Codes as people write them: a run of letters and a run of digits joined by a hyphen, a space
or nothing are one code ("QX-99812", "QX 99812" and "QX99812"; "COVID-19" and "covid19"; "AB
1234" and "AB1234"), and recall finds any spelling for any other, as it finds a number in any
grouping of its digits (heron/memory/numbers.py, which this module applies to each spelling).

The indexes read the spellings as different words: FTS5 splits "qx-99812" and "qx 99812" into
"qx" and "99812" but keeps "qx99812" one word; PostgreSQL's parser reads "qx-99812" as 'qx' <->
'-99812', "qx 99812" as 'qx' <-> '99812' and "qx99812" as one word. So a term with such a seam
is searched as an OR of its spellings (`fts_forms`, `pg_forms`) and held, in auto-recall's gate,
by a pattern that takes every spelling (`pattern`).

A seam is only where letters meet digits. A separator between two runs of digits or of letters
stays as typed ("2023-05-01"; "v2.3.1" is not "v231": a version's dots are not a seam), and so
does a run of one letter or a stop word next to digits ("A4", "v2", "I-95", "10am": "a 4", "i 95"
and "10 am" are as often a word beside a number, and PostgreSQL drops a stop word from a query,
so "i 95" would search every "95"), and the digits of a grouped or decimal number ("48,250": its
"48" is no code's part). Pure text, no I/O.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass

from heron.memory import numbers
from heron.memory.stopwords import STOPWORDS

_RUN = re.compile(r"[^\W\d_]+|\d+")
# What may stand in a seam as typed; FTS5 reads a hyphen as a space, PostgreSQL does not.
SEAM_MARKS = frozenset({"", "-", " "})
FTS_MARKS = ("", " ")
PG_MARKS = ("", " ", "-")
# What continues a run of digits as one number ("48,250", "3.14", "10:30").
_NUMBER_MARKS = frozenset(".,'\u2019:")
# Spellings of one term searched at most (each seam multiplies them; the further seams only as
# typed): two seams in every spelling PostgreSQL tells apart.
MOST_SPELLINGS = 9
# A seam's pattern in the gate: any run of separators, none included, as FTS5 reads them.
_SEAM = r"[\W_]*"
_APART = r"[\W_]+"


@dataclass(frozen=True)
class _Parsed:
    """A term's runs of letters or digits, the text before each (`gaps[0]`: before the first),
    the text after the last, and the runs a seam comes before."""

    runs: tuple[str, ...]
    gaps: tuple[str, ...]
    tail: str
    seams: tuple[int, ...]


@functools.lru_cache(maxsize=1024)
def _parse(term: str) -> _Parsed:
    runs: list[str] = []
    gaps: list[str] = []
    end = 0
    for found in _RUN.finditer(term):
        gaps.append(term[end : found.start()])
        runs.append(found.group())
        end = found.end()
    seams = tuple(k for k in range(1, len(runs)) if _seam(runs, gaps, k))
    return _Parsed(tuple(runs), tuple(gaps), term[end:], seams)


def _letters(run: str) -> bool:
    return len(run) >= 2 and not run.isdecimal() and run.lower() not in STOPWORDS


def _number_goes_on(runs: list[str], gaps: list[str], k: int, step: int) -> bool:
    """Whether the digits `runs[k]` go on as one number on the side of `step` (-1, 1)."""
    j = k + step
    gap = gaps[max(k, j)] if 0 <= j < len(runs) else ""
    return gap in _NUMBER_MARKS and runs[j].isdecimal()


def _seam(runs: list[str], gaps: list[str], k: int) -> bool:
    """Whether the gap before `runs[k]` is a code's seam (see the module docstring)."""
    before, after = runs[k - 1], runs[k]
    if gaps[k] not in SEAM_MARKS:
        return False
    if _letters(before) and after.isdecimal():
        return not _number_goes_on(runs, gaps, k, 1)
    if before.isdecimal() and _letters(after):
        return not _number_goes_on(runs, gaps, k - 1, -1)
    return False


def has_seam(term: str) -> bool:
    """Whether a term holds a code's seam, so that it is searched in several spellings."""
    return bool(_parse(term).seams)


def spellings(term: str, marks: tuple[str, ...] = FTS_MARKS) -> list[str]:
    """`term` with each seam written with each of `marks`, the term as typed first."""
    parsed = _parse(term)
    if not parsed.seams:
        return [term]
    choices: list[list[str]] = []
    count = 1
    for k, gap in enumerate(parsed.gaps):
        if k in parsed.seams and count * len(marks) <= MOST_SPELLINGS:
            options = list(dict.fromkeys([gap, *marks]))
            count *= len(options)
            choices.append(options)
        else:
            choices.append([gap])
    return [
        "".join(g + r for g, r in zip(gaps, parsed.runs, strict=True)) + parsed.tail
        for gaps in itertools.product(*choices)
    ]


def fts_forms(term: str) -> list[str]:
    """The texts an FTS5 phrase of `term` is searched as: each spelling of its seams, in each
    grouping of its numbers (`numbers.fts_forms`)."""
    forms = (f for s in spellings(term, FTS_MARKS) for f in numbers.fts_forms(s))
    return list(dict.fromkeys(forms))


def pg_forms(term: str) -> list[str]:
    """`fts_forms` for PostgreSQL's parser (each form to be parsed as typed)."""
    forms = (f for s in spellings(term, PG_MARKS) for f in numbers.pg_forms(s))
    return list(dict.fromkeys(forms))


def head(term: str) -> str:
    """What every spelling of the term starts with: its first run, and the runs joined to it
    with nothing between them up to its first seam ("qx" of "qx99812", "v2" of "v2.3.1")."""
    parsed = _parse(term)
    if not parsed.runs:
        return term
    out = parsed.runs[0]
    for k in range(1, len(parsed.runs)):
        if parsed.gaps[k] or k in parsed.seams:
            break
        out += parsed.runs[k]
    return out


def pattern(term: str) -> str:
    """A regular expression (for lowercased text) that finds a term (words and numbers
    separated by spaces, as recall's terms are) in any spelling of its seams and any grouping
    of its numbers: runs joined with nothing stay so, other separators are any run of them
    (as the index's tokenizer reads them), a seam any run or none. Without the checks at its
    two ends, which the caller adds."""
    parsed = _parse(term)
    out: list[str] = []
    k = 0  # the term's run that the token starts with
    for n, token in enumerate(term.split(" ")):
        count = len(_RUN.findall(token))
        if not count:
            continue
        if out:
            out.append(_SEAM if k in parsed.seams else _APART)
        whole = numbers.digits(token)
        if whole is not None:
            joined = (n > 0 and k in parsed.seams, k + count in parsed.seams)
            out.append(numbers.pattern(whole, f"s{n}", *joined))
        else:
            out.append(_runs_pattern(parsed, k, k + count))
        k += count
    return "".join(out)


def _runs_pattern(parsed: _Parsed, first: int, end: int) -> str:
    out = [re.escape(parsed.runs[first])]
    for k in range(first + 1, end):
        gap = parsed.gaps[k]
        out.append(_SEAM if k in parsed.seams else _APART if gap else "")
        out.append(re.escape(parsed.runs[k]))
    return "".join(out)
