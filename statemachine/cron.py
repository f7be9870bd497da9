"""A five-field cron expression, and the instants it fires at in a time zone.

Pure and clock-free: the caller passes every instant (epoch seconds). Maintenance windows
(`statemachine.maintenance_window`) open at these instants. Fields as Vixie cron reads
them: minute, hour, day of month, month (1-12 or jan-dec), day of week (0-7, 0 and 7
Sunday, or sun-sat); each a list of `*`, `N`, `A-B`, with an optional `/STEP`. When
both day fields are restricted (neither starts with `*`) a day matches either, as in
cron; otherwise it must match both. `@hourly`, `@daily`, `@weekly`, `@monthly`,
`@yearly` (`@annually`) stand for their usual expansions.

Wall times are in the time zone: a wall time the clock skips (a DST gap) fires when the
clock would have shown it had it not jumped (02:30 on a spring-forward night is 03:30
local), so a window is never lost; a wall time that occurs twice (fall back) fires once,
at its first occurrence.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo

#: How far the instant search looks (days): past the longest gap between two firings
#: a cron can have (29 February on a given weekday is not one: the day fields are ORed).
HORIZON_DAYS = 4 * 366 + 2
#: Bound on how far DST can move a wall time from the instant it names (seconds).
_SHIFT_S = 3 * 3600

_MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
#: The most days each month can have (February: 29, for leap years).
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class CronError(ValueError):
    """A cron expression that cannot be read, or that never fires."""


def _number(text: str, names: dict[str, int], name: str) -> int:
    value = names.get(text.lower())
    if value is not None:
        return value
    if not text.isdigit():
        raise CronError(f"{name}: {text!r} is not a number")
    return int(text)


def _field(text: str, name: str, low: int, high: int, names: dict[str, int]) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{name}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, end = _number(first, names, name), _number(last, names, name)
        else:
            start = _number(base, names, name)
            end = high if slash else start
        if not low <= start <= high or not low <= end <= high:
            raise CronError(f"{name}: {part!r} is outside {low}-{high}")
        if start > end:
            raise CronError(f"{name}: range {part!r} runs backwards")
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    """A parsed expression; `fires` says where it fires in the zone given."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 = Sunday (7 folded onto it)."""
    days_any: bool
    weekdays_any: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        expr = _MACROS.get(text.strip().lower(), text)
        fields = expr.split()
        if len(fields) != 5:
            raise CronError(f"{text!r}: want 5 fields (minute hour day month weekday)")
        parsed = [
            _field(f, name, low, high, names)
            for f, (name, low, high, names) in zip(fields, _FIELDS, strict=True)
        ]
        cron = cls(
            text=text.strip(),
            minutes=tuple(sorted(parsed[0])),
            hours=tuple(sorted(parsed[1])),
            days=parsed[2],
            months=parsed[3],
            weekdays=frozenset(d % 7 for d in parsed[4]),
            days_any=fields[2].startswith("*"),
            weekdays_any=fields[4].startswith("*"),
        )
        if not cron._some_day():
            raise CronError(f"{text!r} never fires (no such day in those months)")
        return cron

    def _some_day(self) -> bool:
        """Whether any calendar day matches (`0 0 31 2 *` never does)."""
        if self.days_any or not self.weekdays_any:
            return True  # every day of those months, or any of their weekdays
        return any(d <= _MONTH_DAYS[m - 1] for m in self.months for d in self.days)

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.weekday() + 1) % 7 in self.weekdays
        if self.days_any or self.weekdays_any:
            return in_month and in_week
        return in_month or in_week

    def _instant(self, day: date, hour: int, minute: int, zone: tzinfo) -> float:
        # fold=0: a repeated wall time is its first occurrence; a skipped one is read
        # with the offset before the jump, i.e. shifted forward by the gap.
        return datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone).timestamp()

    def _steady(self, day: date, hour: int, zone: tzinfo) -> bool:
        """Whether the hour's wall minutes map to evenly spaced instants (no UTC offset
        change inside it, as there is in a half-hour DST gap)."""
        span = self._instant(day, hour, 59, zone) - self._instant(day, hour, 0, zone)
        return span == 59 * 60

    def _days(self, start: date, step: int) -> Iterator[date]:
        for i in range(HORIZON_DAYS):
            day = start + timedelta(days=step * i)
            if self.matches_day(day):
                yield day

    def next_fire(self, after: float, zone: tzinfo) -> float | None:
        """The first instant at or after ``after`` it fires at; None within the horizon."""
        first = datetime.fromtimestamp(after, zone).date() - timedelta(days=1)
        best: float | None = None
        for day in self._days(first, 1):
            if best is not None and self._instant(day, 0, 0, zone) - _SHIFT_S > best:
                break
            if self._instant(day, 23, 59, zone) + _SHIFT_S < after:
                continue
            for hour in self.hours:
                if self._instant(day, hour, 59, zone) + _SHIFT_S < after:
                    continue
                if best is not None and self._instant(day, hour, 0, zone) - _SHIFT_S > best:
                    break
                steady = self._steady(day, hour, zone)
                for minute in self.minutes:
                    t = self._instant(day, hour, minute, zone)
                    if t >= after and (best is None or t < best):
                        best = t
                    if t >= after and steady:
                        break  # later minutes of a steady hour are later instants
        return best

    def previous_fire(self, before: float, zone: tzinfo) -> float | None:
        """The last instant at or before ``before`` it fired at; None within the horizon."""
        first = datetime.fromtimestamp(before, zone).date() + timedelta(days=1)
        best: float | None = None
        for day in self._days(first, -1):
            if best is not None and self._instant(day, 23, 59, zone) + _SHIFT_S < best:
                break
            if self._instant(day, 0, 0, zone) - _SHIFT_S > before:
                continue
            for hour in reversed(self.hours):
                if self._instant(day, hour, 0, zone) - _SHIFT_S > before:
                    continue
                if best is not None and self._instant(day, hour, 59, zone) + _SHIFT_S < best:
                    break
                steady = self._steady(day, hour, zone)
                for minute in reversed(self.minutes):
                    t = self._instant(day, hour, minute, zone)
                    if t <= before and (best is None or t > best):
                        best = t
                    if t <= before and steady:
                        break  # earlier minutes of a steady hour are earlier instants
        return best
