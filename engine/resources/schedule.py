"""The weekly schedule of allowed hours, as pure functions over local wall-clock time.

A day lists ranges ``"HH:MM-HH:MM"`` (end exclusive, ``24:00`` allowed). A range whose end is not after its
start runs over midnight into the next day (``"22:00-06:00"``). An empty list allows nothing that day.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MINUTES_PER_DAY = 24 * 60
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY
ALL_DAY = "00:00-24:00"
_RANGE = re.compile(r"^(\d\d):(\d\d)-(\d\d):(\d\d)$")


def parse_range(text: str) -> tuple[int, int]:
    """``"08:30-17:00"`` -> minutes (510, 1020). Raises ValueError with a plain message."""
    m = _RANGE.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a time range like '08:00-17:30'")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    for h, mi in ((h1, m1), (h2, m2)):
        if mi > 59 or h > 24 or (h == 24 and mi != 0):
            raise ValueError(f"{text!r} has a time that does not exist (hours 00-24, minutes 00-59)")
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == MINUTES_PER_DAY:
        raise ValueError(f"{text!r} starts at 24:00; start at 00:00 of the next day instead")
    return start, end


def week_intervals(days: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """Allowed minutes of the week (Monday 00:00 = 0) as sorted, merged half-open intervals."""
    raw: list[tuple[int, int]] = []
    for d, ranges in enumerate(days):
        base = d * MINUTES_PER_DAY
        for text in ranges:
            start, end = parse_range(text)
            if end <= start:  # over midnight
                end += MINUTES_PER_DAY
            lo, hi = base + start, base + end
            if hi > MINUTES_PER_WEEK:  # Sunday night into Monday morning
                raw.append((lo, MINUTES_PER_WEEK))
                raw.append((0, hi - MINUTES_PER_WEEK))
            else:
                raw.append((lo, hi))
    raw.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in raw:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _minute_of_week(now: datetime) -> int:
    return now.weekday() * MINUTES_PER_DAY + now.hour * 60 + now.minute


def is_allowed(intervals: Sequence[tuple[int, int]], now: datetime) -> bool:
    m = _minute_of_week(now)
    return any(lo <= m < hi for lo, hi in intervals)


def next_allowed(intervals: Sequence[tuple[int, int]], now: datetime) -> datetime | None:
    """The first allowed minute at or after ``now`` (``now`` itself if allowed); None if nothing is."""
    if not intervals:
        return None
    m = _minute_of_week(now)
    if any(lo <= m < hi for lo, hi in intervals):
        return now
    later = [lo for lo, _ in intervals if lo > m]
    delta = (later[0] - m) if later else (MINUTES_PER_WEEK - m + intervals[0][0])
    return now.replace(second=0, microsecond=0) + timedelta(minutes=delta)


def describe_when(when: datetime, now: datetime) -> str:
    """'at 18:00', 'tomorrow at 08:00' or 'on Tuesday at 08:00' (short, for the tray)."""
    clock = when.strftime("%H:%M")
    days = (when.date() - now.date()).days
    if days <= 0:
        return f"at {clock}"
    if days == 1:
        return f"tomorrow at {clock}"
    if days < 7:
        return f"on {DAY_NAMES[when.weekday()]} at {clock}"
    return f"on {when.strftime('%d %B')} at {clock}"
