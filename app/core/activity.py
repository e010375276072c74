"""Recent activity from successive status snapshots: requests and bytes per second over the last minutes,
and the chart's time axis: clock times at round steps (14:05, 14:06 or 14:05:15, 14:05:30), which a
person reads at a glance where "-0.2 minutes ago" made them compute.

Pure (no Qt), so it is tested without a screen. Counters that go backwards (the node restarted) start a
new baseline instead of producing negative rates.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

WINDOW_S = 600.0  # what the status window's chart shows
MIN_SPACING_S = 2.0  # one point per two seconds at most: a steady chart and little memory


@dataclass(frozen=True, slots=True)
class Point:
    t: float
    requests_per_s: float
    up_kib_s: float
    down_kib_s: float


class Activity:
    def __init__(self, window_s: float = WINDOW_S, spacing_s: float = MIN_SPACING_S) -> None:
        self.window_s = window_s
        self.spacing_s = spacing_s
        self.points: deque[Point] = deque()
        self._last: tuple[float, int, int, int] | None = None

    def add(self, status: dict[str, Any], t: float) -> Point | None:
        """Record a snapshot taken at monotonic time ``t``; returns the new point, if one was made."""
        try:
            now = (
                t,
                int(status.get("requests_served") or 0),
                int(status.get("bytes_up") or 0),
                int(status.get("bytes_down") or 0),
            )
        except (TypeError, ValueError):
            return None
        last = self._last
        if last is None or any(b < a for a, b in zip(last[1:], now[1:], strict=True)):
            self._last = now
            return None
        dt = t - last[0]
        if dt < self.spacing_s:
            return None
        self._last = now
        point = Point(
            t, (now[1] - last[1]) / dt, (now[2] - last[2]) / dt / 1024, (now[3] - last[3]) / dt / 1024
        )
        self.points.append(point)
        while self.points and self.points[0].t < t - self.window_s:
            self.points.popleft()
        return point

    def series(self, now: float, wall: float) -> tuple[list[float], list[float], list[float], list[float]]:
        """Each point's wall-clock time (unix seconds; ``now`` is the monotonic time of ``wall``),
        requests/s, upload KiB/s, download KiB/s."""
        pts = list(self.points)
        return (
            [wall - (now - p.t) for p in pts],
            [p.requests_per_s for p in pts],
            [p.up_kib_s for p in pts],
            [p.down_kib_s for p in pts],
        )


TICK_STEPS_S = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)


def clock_ticks(start: float, end: float, most: int = 5) -> list[tuple[float, str]]:
    """Ticks for a time axis from ``start`` to ``end`` (unix seconds): the smallest round step that
    gives at most ``most`` ticks, at whole multiples of it in local time, labelled HH:MM (HH:MM:SS for
    steps under a minute)."""
    if not end > start:
        return []
    step = next((s for s in TICK_STEPS_S if (end - start) / s <= most), TICK_STEPS_S[-1])
    offset = time.localtime(start).tm_gmtoff  # local midnight-aligned steps, as a wall clock shows them
    first = -((start + offset) // -step) * step - offset
    ticks = []
    t = first
    while t <= end:
        ticks.append((t, clock_label(t, step)))
        t += step
    return ticks


def clock_label(t: float, step: float) -> str:
    """``t`` as this computer's clock shows it, to the second only where ticks are under a minute apart."""
    return time.strftime("%H:%M" if step >= 60 else "%H:%M:%S", time.localtime(t))


MILESTONES = (10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)


def milestone_crossed(previous: float, credit: float) -> float | None:
    """The highest milestone passed between ``previous`` and ``credit``, if any (for a notification)."""
    passed = [m for m in MILESTONES if previous < m <= credit]
    return float(passed[-1]) if passed else None
