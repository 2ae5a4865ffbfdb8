"""When a job fires: a cron expression, an interval, or one instant, read in the user's timezone.

Pure functions over the three kinds a job row stores (`kind`, `spec`, `timezone`), shared by the
`schedule` tool, `heron jobs add` and the scheduler, so each reads a schedule the same way.

A cron expression is walked in local wall-clock time (croniter on naive local datetimes) and
each instant is then placed in the zone, so "0 9 * * *" stays at 09:00 on both sides of a DST
change. A local time that does not exist (the hour skipped in spring) is placed as zoneinfo
does with fold 0, i.e. the hour after; one that exists twice (autumn) fires once, at the first.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from heron.errors import HeronError

Kind = Literal["cron", "every", "at"]
MIN_INTERVAL_S = 60  # the scheduler works to the minute; a tighter loop is a busy loop
# Past a year an interval is a slip (`99999999d` was saved, and its next time, in the year
# 275817, broke every listing of jobs); what recurs yearly is a cron (`0 9 24 12 *`).
MAX_INTERVAL_S = 366 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_EVERY = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")


class ScheduleError(HeronError):
    """A schedule that cannot be read; the hint shows the forms that work."""


HINT = (
    'Give one of: cron="0 9 * * 1-5" (minute hour day month weekday), every="30m" (s, m, h, d '
    'or w; at least 1m), or at="2026-12-24 18:00" (local time, or with an offset).'
)
# The same forms as `heron jobs add` takes them: its options, not the tool's arguments.
CLI_HINT = (
    'Give one of: --cron "0 9 * * 1-5" (minute hour day month weekday), --every 30m (s, m, h, '
    'd or w; at least 1m), or --at "2026-12-24 18:00" (local time, or with an offset).'
)


@dataclass(frozen=True)
class Schedule:
    kind: Kind
    spec: str  # cron: the expression; every: seconds; at: an ISO instant with its offset
    timezone: str

    def zone(self) -> ZoneInfo:
        return zone_of(self.timezone)

    def describe(self) -> str:
        """As the person reads it; a row that cannot be read back says so, never raises."""
        try:
            return self._described()
        except (ValueError, OverflowError):
            return f"{self.kind} {self.spec!r} (damaged)"

    def readable(self) -> bool:
        """Whether the stored schedule reads back (a row an older Heron or a hand edit left)."""
        try:
            self._described()
        except (ValueError, OverflowError):
            return False
        return True

    def _described(self) -> str:
        if self.kind == "cron":
            return f"cron {self.spec} ({self.timezone})"
        if self.kind == "every":
            return f"every {_span(int(self.spec))}"
        at = dt.datetime.fromisoformat(self.spec).astimezone(self.zone())
        return f"once at {at:%Y-%m-%d %H:%M} ({self.timezone})"

    def next_after(self, after: float, base: float | None = None) -> float | None:
        """The first instant strictly after `after` (epoch seconds); None when there is none.
        `base`: an interval's phase (its previous instant), so it does not drift."""
        if self.kind == "at":
            at = dt.datetime.fromisoformat(self.spec).timestamp()
            return at if at > after else None
        if self.kind == "every":
            step = int(self.spec)
            start = after if base is None else base
            if start > after:
                return start
            return start + ((after - start) // step + 1) * step
        return _cron_next(self.spec, self.zone(), after)

    def last_at_or_before(self, at: float) -> float | None:
        """The latest instant at or before `at` (epoch seconds), found directly (croniter
        walks back from `at`); None when there is none."""
        if self.kind == "at":
            once = dt.datetime.fromisoformat(self.spec).timestamp()
            return once if once <= at else None
        if self.kind == "every":  # an interval has no phase of its own: its base is the caller's
            raise ValueError("an interval's instants depend on its base")
        return _cron_prev(self.spec, self.zone(), at)


def zone_of(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ScheduleError(
            f"unknown timezone {name!r}",
            hint='Set [agent] timezone in config.toml to an IANA name such as "Europe/Berlin".',
        ) from e


def user_timezone(configured: str | None) -> str:
    """The user's timezone: `[agent] timezone`, else the system's IANA name (the TZ variable,
    which is what this process's local time follows, then the local zone, /etc/timezone or the
    /etc/localtime link), else UTC: an abbreviation like CET cannot be walked across a DST
    change. The runtime block the model reads names the same zone (heron/agent/turn.py)."""
    if configured:
        zone_of(configured)
        return configured
    candidates = [_named_in(os.environ.get("TZ", ""))]
    # A ZoneInfo has `key`; the fixed-offset zone of a bare system does not.
    key = getattr(dt.datetime.now().astimezone().tzinfo, "key", None)  # probe: stdlib tzinfo
    candidates += [str(key)] if key else []
    with contextlib.suppress(OSError):
        candidates.append(Path("/etc/timezone").read_text(encoding="utf-8").strip())
    target = os.path.realpath("/etc/localtime")
    if "zoneinfo/" in target:
        candidates.append(target.split("zoneinfo/", 1)[1])
    for name in filter(None, candidates):
        with contextlib.suppress(ScheduleError):
            zone_of(name)
            return name
    return "UTC"


def _named_in(tz: str) -> str:
    """The IANA name in a TZ value: `America/New_York`, `:America/New_York` or a path into a
    zoneinfo folder; "" for none (unset, or a POSIX rule like `EST5EDT,M3.2.0,M11.1.0`)."""
    tz = tz.removeprefix(":")
    return tz.split("zoneinfo/", 1)[1] if "zoneinfo/" in tz else tz


def parse(
    *, cron: str | None = None, every: str | None = None, at: str | None = None, timezone: str
) -> Schedule:
    """Exactly one of cron, every, at, read in `timezone`."""
    given = [(k, v) for k, v in (("cron", cron), ("every", every), ("at", at)) if v]
    if len(given) != 1:
        which = "none" if not given else " and ".join(k for k, _ in given)
        raise ScheduleError(f"a job needs exactly one schedule; got {which}", hint=HINT)
    kind, value = given[0]
    zone = zone_of(timezone)
    if kind == "cron":
        expr = " ".join(str(value).split())
        from croniter import croniter  # here: most processes never read a cron expression

        if len(expr.split()) != 5 or not croniter.is_valid(expr):
            raise ScheduleError(f"not a cron expression: {value!r}", hint=HINT)
        if _cron_next(expr, zone, dt.datetime.now(dt.UTC).timestamp()) is None:
            raise ScheduleError(
                f"the cron expression {value!r} never fires: no date has that day in that month",
                hint=HINT,
            )
        return Schedule("cron", expr, timezone)
    if kind == "every":
        return Schedule("every", str(_seconds(str(value))), timezone)
    return Schedule("at", _instant(str(value), zone).isoformat(), timezone)


def _seconds(text: str) -> int:
    found = _EVERY.match(text.lower())
    if not found:
        raise ScheduleError(f"not an interval: {text!r}", hint=HINT)
    seconds = int(found.group(1)) * _UNITS[found.group(2) or "s"]
    if seconds < MIN_INTERVAL_S:
        raise ScheduleError(f"interval {text!r} is under a minute", hint=HINT)
    if seconds > MAX_INTERVAL_S:
        raise ScheduleError(
            f"interval {text!r} is over a year",
            hint=f'Give at most every="366d"; for a date each year, a cron. {HINT}',
        )
    return seconds


def _instant(text: str, zone: ZoneInfo) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("T", " ", 1))
        if when.tzinfo is None:
            when = when.replace(tzinfo=zone)
        return when.astimezone(dt.UTC)  # the year 1 in a zone east of UTC has no UTC date
    except (ValueError, OverflowError) as e:
        raise ScheduleError(f"not a date and time: {text!r}", hint=HINT) from e


def _cron_next(expr: str, zone: ZoneInfo, after: float) -> float | None:
    """The first instant after `after`; None for an expression no date matches (30 February),
    which croniter reports by raising once it has searched far enough."""
    from croniter import croniter
    from croniter.croniter import CroniterBadDateError

    local = dt.datetime.fromtimestamp(after, zone).replace(tzinfo=None)
    walker = croniter(expr, local)
    while True:
        try:
            naive: dt.datetime = walker.get_next(dt.datetime)
        except CroniterBadDateError:
            return None
        instant = naive.replace(tzinfo=zone).timestamp()
        if instant > after:  # a skipped hour can place an instant at or before `after`
            return instant


def _cron_prev(expr: str, zone: ZoneInfo, at: float) -> float | None:
    """The latest instant at or before `at`, walking back from the minute after it."""
    from croniter import croniter
    from croniter.croniter import CroniterBadDateError

    local = dt.datetime.fromtimestamp(at, zone).replace(tzinfo=None, second=0, microsecond=0)
    walker = croniter(expr, local + dt.timedelta(minutes=1))
    while True:
        try:
            naive: dt.datetime = walker.get_prev(dt.datetime)
        except CroniterBadDateError:
            return None
        instant = naive.replace(tzinfo=zone).timestamp()
        if instant <= at:  # a skipped hour can place an instant after `at`
            return instant


def _span(seconds: int) -> str:
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
