"""Times as the person and the model read them: an epoch instant in the agent's zone.

Heron has one zone for the person, `[agent] timezone`, else the system's
(`heron.store.schedule.user_timezone`, `Settings.timezone`). Every time Heron prints, sends to
the browser or puts before the model goes through `when` with that zone's name, never the
process's local time (`time.localtime`, a naive `fromtimestamp`), so a serve and a CLI started
with different TZ values agree, and a day boundary (`heron usage` by day) is the person's.

Pure and stdlib only: the zone's name comes from the caller, checked already.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

MINUTE = "%Y-%m-%d %H:%M"
SECOND = "%Y-%m-%d %H:%M:%S"
DAY = "%Y-%m-%d"
ISO = "%Y-%m-%dT%H:%M:%S%z"  # with its offset: an instant, whoever reads it


OUT_OF_RANGE = "(out of range)"  # an instant no calendar date holds: a damaged row's
# A day inside the calendar's first and last year in every zone (offsets are under a day).
_FIRST = dt.datetime(1, 1, 2, tzinfo=dt.UTC).timestamp()
_LAST = dt.datetime(9999, 12, 30, tzinfo=dt.UTC).timestamp()


def in_range(ts: float) -> bool:
    """Whether `ts` (epoch seconds) is a date a calendar can show, in every zone: a row an
    older Heron saved unbounded (`--every 99999999d`: the year 275817) is not."""
    return _FIRST <= ts < _LAST  # NaN is neither


def when(ts: float, zone: str, fmt: str = MINUTE, *, named: bool = False) -> str:
    """`ts` (epoch seconds) in `zone` (an IANA name) as `fmt`; `named` adds the zone's
    abbreviation ("13:40 CET"), for a time shown alone rather than in a list whose header
    names the zone. An instant out of the calendar's range is `OUT_OF_RANGE`, never an
    error: one damaged row must not take down a listing of them all."""
    if not in_range(ts):
        return OUT_OF_RANGE
    local = dt.datetime.fromtimestamp(ts, ZoneInfo(zone))
    text = local.strftime(fmt)
    return f"{text} {local:%Z}" if named else text


def local_date(ts: float, zone: str) -> dt.date:
    """The person's calendar date of `ts`: what a month or a year named in a question means."""
    return dt.datetime.fromtimestamp(ts, ZoneInfo(zone)).date()


def day_bounds(day: dt.date, zone: str) -> tuple[float, float]:
    """The instants (epoch seconds) the person's `day` begins and the next one begins, in
    `zone`: a day named in a question is that span, 23 or 25 hours long when the clocks
    change."""
    tz = ZoneInfo(zone)
    start = dt.datetime.combine(day, dt.time(), tz)
    end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tz)
    return start.timestamp(), end.timestamp()
