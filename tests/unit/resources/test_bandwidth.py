import asyncio
import json
from datetime import datetime
from pathlib import Path

import pytest

from engine.resources.bandwidth import DataCapCounter, TokenBucket, period_end, period_key
from engine.resources.errors import DataCapReached


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


async def test_bucket_burst_then_rate() -> None:
    ft = FakeTime()
    b = TokenBucket(1000, 2000, clock=ft.clock, sleep=ft.sleep)
    await b.acquire(2000)
    assert ft.sleeps == []
    await b.acquire(500)
    assert ft.sleeps == [pytest.approx(0.5)]
    ft.t += 10  # refills only up to the burst
    assert b.tokens == 2000


async def test_bucket_large_message_and_fifo_reservation() -> None:
    ft = FakeTime()
    b = TokenBucket(1000, 1000, clock=ft.clock, sleep=ft.sleep)
    await b.acquire(5000)  # larger than the burst still passes, after the deficit
    assert ft.sleeps == [pytest.approx(4.0)]
    assert b.delay_for(1000) == pytest.approx(1.0)


async def test_bucket_unlimited_and_try() -> None:
    b = TokenBucket(0)
    await b.acquire(10**12)
    assert b.try_acquire(10**12)
    ft = FakeTime()
    b = TokenBucket(100, 100, clock=ft.clock, sleep=ft.sleep)
    assert b.try_acquire(100) and not b.try_acquire(1)


async def test_bucket_cancel_refunds() -> None:
    b = TokenBucket(10, 10)
    await b.acquire(10)
    task = asyncio.create_task(b.acquire(1000))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b.tokens < 10.5 and b.tokens >= 0


async def test_bucket_real_rate() -> None:
    b = TokenBucket(200_000, 10_000)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for _ in range(11):
        await b.acquire(10_000)
    assert 0.45 < loop.time() - t0 < 1.5


def test_period_key_and_end() -> None:
    assert period_key(datetime(2025, 1, 3), 5) == (2024, 12)
    assert period_key(datetime(2025, 1, 5), 5) == (2025, 1)
    assert period_end((2024, 12), 5) == datetime(2025, 1, 5)


def test_monthly_cap_rollover_and_persistence(tmp_path: Path) -> None:
    now = [datetime(2025, 7, 30, 23, 0)]
    path = tmp_path / "data.json"
    c = DataCapCounter(path, now=lambda: now[0], save_every_s=0)
    c.add(sent=600, received=500)
    assert c.used() == 1100
    with pytest.raises(DataCapReached):
        c.check(1000)
    c.check(None)
    assert json.loads(path.read_text())["period"] == [2025, 7]
    assert c.totals() == {"today_up": 600, "today_down": 500, "period_up": 600, "period_down": 500}
    assert DataCapCounter(path, now=lambda: now[0]).used() == 1100  # survives a restart
    now[0] = datetime(2025, 8, 1, 0, 1)
    assert c.used() == 0 and c.period_end() == datetime(2025, 9, 1)
    c.add(sent=7)
    now[0] = datetime(2025, 7, 31, 12, 0)  # clock set back: the period does not go back
    assert c.used() == 7
    c.flush()
    assert DataCapCounter(path, now=lambda: now[0]).used() == 7


def test_today_rolls_over_at_midnight_and_survives_a_restart(tmp_path: Path) -> None:
    now = [datetime(2025, 7, 10, 23, 59)]
    path = tmp_path / "data.json"
    c = DataCapCounter(path, now=lambda: now[0], save_every_s=0)
    c.add(sent=10, received=20)
    assert DataCapCounter(path, now=lambda: now[0]).totals()["today_down"] == 20
    now[0] = datetime(2025, 7, 11, 0, 0)
    c.add(sent=1)
    assert c.totals() == {"today_up": 1, "today_down": 0, "period_up": 11, "period_down": 20}
    assert DataCapCounter(path, now=lambda: now[0]).totals()["today_up"] == 1


def test_damaged_state_file_starts_from_zero(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    path.write_text("{not json")
    assert DataCapCounter(path).used() == 0
