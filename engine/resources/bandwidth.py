"""Upload/download caps as asyncio token buckets, and the monthly data-cap counter.

The transport calls ``await bucket.acquire(n)`` before sending (or after receiving) ``n`` bytes and
``counter.add(sent=..., received=...)``; the governor reads ``counter.used(now)`` to pause at the cap.

Buckets measure time with an injectable monotonic clock, so a wall-clock jump changes nothing. The cap
counter keys its period on the wall clock (a calendar month starting on ``reset_day``) and only ever moves
forward: a clock set backwards into last month does not reset or resurrect a period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

from engine.files import atomic_write

from .errors import BandwidthError, DataCapReached


class TokenBucket:
    """``rate`` bytes per second with bursts up to ``burst`` bytes; ``rate`` 0 means unlimited.

    A request larger than the tokens on hand reserves them at once (the balance goes negative) and sleeps
    for the deficit, so waiters are served in order and a message larger than ``burst`` still passes.
    A cancelled wait gives its reservation back.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate < 0 or (burst is not None and burst <= 0):
            raise BandwidthError("a token bucket needs rate >= 0 and burst > 0")
        self._clock = clock
        self._sleep = sleep
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(self.rate, 64 * 1024.0)
        self._tokens = self.burst
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._stamp
        self._stamp = now
        if elapsed > 0:  # a monotonic clock never goes back, but fakes and odd platforms might
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens

    def set_rate(self, rate: float, burst: float | None = None) -> None:
        self._refill()
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(self.rate, 64 * 1024.0)
        self._tokens = min(self._tokens, self.burst)

    def try_acquire(self, n: int) -> bool:
        if self.rate == 0:
            return True
        self._refill()
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False

    def delay_for(self, n: int) -> float:
        """Seconds ``acquire(n)`` would wait now."""
        if self.rate == 0:
            return 0.0
        self._refill()
        return max(0.0, (n - self._tokens) / self.rate)

    async def acquire(self, n: int) -> None:
        if n < 0:
            raise BandwidthError("cannot acquire a negative number of bytes")
        if self.rate == 0:
            return
        self._refill()
        wait = max(0.0, (n - self._tokens) / self.rate)
        self._tokens -= n
        if wait <= 0:
            return
        try:
            await self._sleep(wait)
        except asyncio.CancelledError:
            self._tokens += n
            raise


def period_key(now: datetime, reset_day: int = 1) -> tuple[int, int]:
    """(year, month) of the cap period containing ``now``; a period starts on ``reset_day`` at 00:00."""
    if now.day >= reset_day:
        return now.year, now.month
    return (now.year - 1, 12) if now.month == 1 else (now.year, now.month - 1)


def period_end(key: tuple[int, int], reset_day: int = 1) -> datetime:
    """Local midnight at which the period ``key`` ends (the next period's first moment)."""
    year, month = key
    year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return datetime(year, month, reset_day)


class DataCapCounter:
    """Bytes sent and received this period, persisted to a small JSON file (written at most every
    ``save_every_s`` seconds of activity, and by ``flush()``; the transport calls flush at shutdown)."""

    def __init__(
        self,
        path: Path,
        reset_day: int = 1,
        *,
        now: Callable[[], datetime] = datetime.now,
        clock: Callable[[], float] = time.monotonic,
        save_every_s: float = 30.0,
    ) -> None:
        self.path = path
        self.reset_day = reset_day
        self._now = now
        self._clock = clock
        self._save_every = save_every_s
        self._last_save = clock()
        self._dirty = False
        self.period = period_key(now(), reset_day)
        self.sent = 0
        self.received = 0
        self.day = now().date().toordinal()  # today's bytes too, for what the tray shows
        self.day_sent = 0
        self.day_received = 0
        self._load()

    def _load(self) -> None:
        try:
            state = json.loads(self.path.read_text())
            period = (int(state["period"][0]), int(state["period"][1]))
            sent, received = int(state["sent"]), int(state["received"])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return  # missing or damaged: start this period from zero
        if period >= self.period:
            self.period, self.sent, self.received = period, max(0, sent), max(0, received)
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if int(state["day"]) == self.day:
                self.day_sent = max(0, int(state["day_sent"]))
                self.day_received = max(0, int(state["day_received"]))

    def _roll(self) -> None:
        key = period_key(self._now(), self.reset_day)
        if key > self.period:
            self.period, self.sent, self.received = key, 0, 0
            self._dirty = True
        day = self._now().date().toordinal()
        if day != self.day:
            self.day, self.day_sent, self.day_received = day, 0, 0
            self._dirty = True

    def add(self, sent: int = 0, received: int = 0) -> None:
        self._roll()
        self.sent += sent
        self.received += received
        self.day_sent += sent
        self.day_received += received
        self._dirty = True
        if self._clock() - self._last_save >= self._save_every:
            self.flush()

    def used(self) -> int:
        self._roll()
        return self.sent + self.received

    def totals(self) -> dict[str, int]:
        """Bytes up and down today and this period (what the tray's status window shows)."""
        self._roll()
        return {
            "today_up": self.day_sent,
            "today_down": self.day_received,
            "period_up": self.sent,
            "period_down": self.received,
        }

    def period_end(self) -> datetime:
        return period_end(self.period, self.reset_day)

    def check(self, cap_bytes: int | None) -> None:
        """Raise DataCapReached when a cap is set and spent."""
        if cap_bytes and self.used() >= cap_bytes:
            raise DataCapReached(f"this month's data cap of {cap_bytes} bytes is used up")

    def flush(self) -> None:
        self._last_save = self._clock()
        if not self._dirty:
            return
        state = {
            "period": list(self.period),
            "sent": self.sent,
            "received": self.received,
            "day": self.day,
            "day_sent": self.day_sent,
            "day_received": self.day_received,
        }
        atomic_write(self.path, json.dumps(state).encode())
        self._dirty = False
