"""The days a recall query names ("last Tuesday", "yesterday", "on 2026-12-01", "December 1",
"on the 1st"):
a question about what was said on a day is answered by the messages written that day, which
rarely hold the words that name it (docs/memory.md, "A day named in the query").

Relative days are read from `today`, the person's date in the agent's zone; a day and month
with no year is the latest such day not after today (a recall asks about the past), and a day
of the month alone ("on the 1st") is this month's or, still to come, the last's. Only the
common unambiguous forms are read: a numeric date other than ISO's year first ("12/01" is the
1st of December in one country and the 12th of January in another) is left as words.

Pure and stdlib only.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

_MONTH_NAMES = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
# A month as written: its name or its usual abbreviation ("Dec", "Sept.").
_MONTH = (
    r"(?P<{}>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_DAY = r"(?P<{}>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?:,?\s+(?P<{}>(?:19|20)\d\d))?"
_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]

_FORMS = re.compile(
    r"\b(?:"
    r"(?P<iso>(?:19|20)\d\d)-(?P<iso_m>[01]?\d)-(?P<iso_d>[0-3]?\d)(?![\d-])"
    + r"|"
    + _MONTH.format("md_m")
    + r"\s+"
    + _DAY.format("md_d")
    + r"(?!\d|:)"
    + _YEAR.format("md_y")
    + r"|(?:the\s+)?"
    + _DAY.format("dm_d")
    + r"\s+(?:of\s+)?"
    + _MONTH.format("dm_m")
    + _YEAR.format("dm_y")
    + r"|(?P<before>the\s+day\s+before\s+yesterday)"
    + r"|(?P<yesterday>yesterday)"
    + r"|(?P<today>today|this\s+morning|this\s+afternoon|this\s+evening|tonight)"
    + r"|(?P<ago>\d{1,2}|"
    + "|".join(_NUMBERS)
    + r")\s+days?\s+ago"
    + r"|(?P<last>last|this\s+past)\s+(?P<last_w>"
    + "|".join(_WEEKDAYS)
    + r")"
    + r"|(?:on\s+)(?P<on_w>"
    + "|".join(_WEEKDAYS)
    + r")"
    # a day of the month alone, as an ordinal: "on the 1st", "the 14th?" (not "the 2nd floor")
    + r"|(?:on\s+the|(?<!\w\s)the)\s+(?P<nth>[0-3]?\d)(?:st|nd|rd|th)(?=\s*(?:[?.!,;]|$))"
    + r"|on\s+the\s+(?P<on_nth>[0-3]?\d)(?:st|nd|rd|th)"
    + r")\b",
    re.IGNORECASE,
)
# "on Friday" is the past Friday only in a question in the past tense ("what did I say on
# Friday"); "my appointment on Friday" is as often the next one.
_PAST = re.compile(r"\b(did|was|were|had|said|told|wrote|asked|mentioned)\b", re.IGNORECASE)


@dataclass(frozen=True)
class NamedDays:
    """The days a query names, and the query with the words naming them taken out."""

    days: frozenset[dt.date]
    rest: str


def named_days(query: str, today: dt.date) -> NamedDays:
    """The days `query` names, read from `today` (the person's date)."""
    days: set[dt.date] = set()
    rest: list[str] = []
    at = 0
    past = bool(_PAST.search(query))
    for found in _FORMS.finditer(query):
        alone = not (query[: found.start()] + query[found.end() :]).strip(" ?.!,;")
        day = _day_of(found, today, past or alone)
        if day is None:
            continue
        days.add(day)
        rest.append(query[at : found.start()])
        at = found.end()
    rest.append(query[at:])
    return NamedDays(frozenset(days), " ".join(" ".join(rest).split()))


def _day_of(found: re.Match[str], today: dt.date, past: bool) -> dt.date | None:
    """The day one match of `_FORMS` names, or None (not a real date, or a form read only in
    a question about the past, or one that is only the day: "on Friday", "on the 1st")."""
    g = found.groupdict()
    if g["iso"]:
        return _date(int(g["iso"]), int(g["iso_m"]), int(g["iso_d"]))
    if g["md_m"] or g["dm_m"]:
        if g["md_m"] and g["md_m"].lower() == "may" and g["md_m"] != "May":
            return None  # "may 5 people come": the verb, as the months of `Cue` read it
        month_word = (g["md_m"] or g["dm_m"]).lower()
        month = next(i for i, m in enumerate(_MONTH_NAMES, 1) if m.startswith(month_word[:3]))
        day = int(g["md_d"] or g["dm_d"])
        year = g["md_y"] or g["dm_y"]
        if year:
            return _date(int(year), month, day)
        named = _date(today.year, month, day)
        if named is not None and named > today:
            named = _date(today.year - 1, month, day)
        return named
    if g["before"]:
        return today - dt.timedelta(days=2)
    if g["yesterday"]:
        return today - dt.timedelta(days=1)
    if g["today"]:
        return today
    if g["nth"] or g["on_nth"]:
        return _of_the_month(int(g["nth"] or g["on_nth"]), today) if past else None
    if g["ago"]:
        text = g["ago"].lower()
        count = int(text) if text.isdigit() else _NUMBERS.index(text) + 1
        return today - dt.timedelta(days=count)
    weekday = g["last_w"] or g["on_w"]
    if weekday is None or (g["on_w"] and not past):
        return None
    # the latest such weekday before today ("last Tuesday" on a Tuesday is a week ago)
    back = (today.weekday() - _WEEKDAYS.index(weekday.lower())) % 7 or 7
    return today - dt.timedelta(days=back)


def _of_the_month(day: int, today: dt.date) -> dt.date | None:
    """The `day` of this month, or of the last when it is still to come (or this month has
    none: "the 31st" in November is October's)."""
    named = _date(today.year, today.month, day)
    if named is not None and named <= today:
        return named
    last = today.replace(day=1) - dt.timedelta(days=1)
    return _date(last.year, last.month, day)


def _date(year: int, month: int, day: int) -> dt.date | None:
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None
