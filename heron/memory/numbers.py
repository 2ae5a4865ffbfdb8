"""Whole numbers as people group their digits: "48250", "48,250", "48 250", "48.250" (European),
"48'250" (Swiss), "$48,250.00" are one number, and recall finds any of them for any other.

The full-text indexes read each grouping differently (FTS5 splits "48,250" into the words "48"
and "250", where "48250" is one word; PostgreSQL's parser makes "48.250" one word and "48,250.00"
the words "48" and "250.00"), so a number is searched as an OR of its written forms
(`fts_forms`, `pg_forms`) and held, in auto-recall's gate, by a pattern that takes every
grouping (`pattern`). Pure text, no I/O: heron/memory/recall.py and records.py use it.

What is not a grouped number stays as it was typed: a list ("1,2,3": its groups are not of
three digits), a decimal ("3.14", "48,250.50": a fraction other than zeros), a code
("QX-99812", "2023-05-01"), a number under 1,000 or written with a leading zero ("0250"), and
a year written bare ("2023": 1900-2099 ungrouped is a year far more often than an amount).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

# What separates the groups of three digits: a comma, a point, an apostrophe (Swiss: 48'250,
# also typographic), a space (no-break and thin spaces too, as typesetting puts them).
GROUP_SEPARATORS = ",.'\u2019 \u00a0\u202f\u2009"
_SEP = "[" + re.escape(GROUP_SEPARATORS) + "]"
# The integer, grouped with one separator throughout or not at all, then perhaps a fraction of
# zeros after the other mark ("48,250.00", "48.250,00", "48250.00").
_NUMBER = re.compile(
    rf"(?P<int>\d{{1,3}}(?P<sep>{_SEP})\d{{3}}(?:(?P=sep)\d{{3}})*|\d+)"
    r"(?:(?P<dec>[.,])0+)?"
)
_YEAR = re.compile(r"(?:19|20)\d\d")
# Forms of one phrase searched at most (a phrase with several numbers multiplies them).
MOST_FORMS = 32


def digits(token: str) -> str | None:
    """The digits of the whole number a token writes, when recall searches it in every grouping
    (see the module docstring for what is not); None otherwise."""
    found = _NUMBER.fullmatch(token)
    if found is None:
        return None
    sep, dec = found["sep"], found["dec"]
    if sep is not None and dec == sep:  # "48,250,00": not a number anyone writes
        return None
    whole = re.sub(r"\D", "", found["int"])
    if len(whole) < 4 or whole[0] == "0":
        return None
    if sep is None and _YEAR.fullmatch(whole):
        return None
    return whole


def groups(whole: str) -> list[str]:
    """ "48250" -> ["48", "250"]: the groups of three digits from the right."""
    head = len(whole) % 3 or 3
    return [whole[:head], *(whole[i : i + 3] for i in range(head, len(whole), 3))]


def lead(whole: str) -> str:
    """The digits every written form of the number starts with (its first group)."""
    return groups(whole)[0]


def _fts_token_forms(token: str) -> list[str]:
    whole = digits(token)
    if whole is None:
        return [token]
    # FTS5's tokenizer splits at every separator, so "48,250" stands for "48 250", "48.250",
    # "48'250" and "$48,250.00" alike (a phrase matches the start of "48 250 00").
    return [whole, ",".join(groups(whole))]


def _pg_token_forms(token: str) -> list[str]:
    whole = digits(token)
    if whole is None:
        return [token]
    grouped = groups(whole)
    # PostgreSQL's parser: "48,250" (and a space, an apostrophe) is '48' <-> '250'; "48.250"
    # one word; a fraction sticks to the last group ("48,250.00": '48' <-> '250.00').
    commas, points = ",".join(grouped), ".".join(grouped)
    return [whole, commas, points, f"{whole}.00", f"{commas}.00"]


def fts_forms(term: str) -> list[str]:
    """The texts an FTS5 phrase of `term` (words separated by spaces, as recall's terms are) is
    searched as: one per grouping of each number in it (the term itself when it has none)."""
    return _product(term, _fts_token_forms)


def pg_forms(term: str) -> list[str]:
    """`fts_forms` for PostgreSQL's parser (each form to be parsed as typed)."""
    return _product(term, _pg_token_forms)


def _product(term: str, forms_of: Callable[[str], list[str]]) -> list[str]:
    tokens = term.split(" ")
    choices: list[list[str]] = []
    count = 1
    for token in tokens:
        forms = forms_of(token)
        if count * len(forms) > MOST_FORMS:  # the further numbers only as typed
            forms = [token]
        count *= len(forms)
        choices.append(forms)
    # a number typed with zero decimals ("48,250.00") is among its forms' matches already
    return list(dict.fromkeys(" ".join(c) for c in itertools.product(*choices)))


def has_number(term: str) -> bool:
    """Whether a term holds a number recall searches in every grouping."""
    return any(digits(t) is not None for t in term.split(" "))


def pattern(whole: str, name: str, joined_before: bool = False, joined_after: bool = False) -> str:
    """A regular expression (for lowercased text) that finds the number `whole` in any grouping
    and only whole: not inside a longer number ("1,048,250", "48,250,000", "482501"), and the
    same separator between all its groups. `name` names its separator's group (unique in the
    pattern it goes into). `joined_before` / `joined_after`: the number is a code's part, with
    letters joined to it on that side ("ab1234": heron/memory/codes.py), so only a digit there
    ends it."""
    grouped = groups(whole)
    sep = f"(?P<{name}>{_SEP})"
    spaced = sep.join(grouped[:2]) + "".join(f"(?P={name}){g}" for g in grouped[2:])
    # Not after a digit and a separator with no space ("1,048,250" holds no "48,250"); not
    # followed by its separator and a digit (a further group).
    before = r"(?<!\d)" if joined_before else r"(?<![^\W_])(?<!\d[,.'\u2019])"
    after = r"(?!\d)" if joined_after else r"(?![^\W_])"
    return rf"{before}(?:{re.escape(whole)}|{spaced}){after}(?!(?P={name})\d)"
