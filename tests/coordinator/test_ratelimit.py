"""Rate limits with a fake clock: no sleeping, exact numbers."""

from __future__ import annotations

import pytest

from coordinator.http.ratelimit import ConnectionLimiter, RateLimiter

from .accounts_helpers import FakeClock


def test_token_bucket_burst_then_refill() -> None:
    clock = FakeClock(0.0)
    limiter = RateLimiter(rate=2.0, burst=5, clock=clock)
    assert [limiter.allow("a") for _ in range(6)] == [True] * 5 + [False]
    assert limiter.allow("b")  # keys are independent
    assert limiter.retry_after("a") == pytest.approx(0.5)
    clock.advance(0.5)
    assert limiter.allow("a") and not limiter.allow("a")
    clock.advance(100)
    assert sum(limiter.allow("a") for _ in range(10)) == 5  # never more than the burst


def test_per_minute_and_pruning() -> None:
    clock = FakeClock(0.0)
    limiter = RateLimiter.per_minute(30, clock=clock)
    assert sum(limiter.allow("ip") for _ in range(40)) == 30
    clock.advance(2.0)
    assert limiter.allow("ip") and not limiter.allow("ip")
    limiter.allow("other")
    assert limiter.prune() == 0
    clock.advance(60)
    assert limiter.prune() == 2 and len(limiter) == 0


def test_memory_is_bounded() -> None:
    limiter = RateLimiter(rate=1.0, burst=1, clock=FakeClock(0.0), max_keys=100)
    for i in range(1000):
        limiter.allow(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter) == 100


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        RateLimiter(rate=0, burst=1)
    with pytest.raises(ValueError):
        ConnectionLimiter(0)


def test_connection_limiter_caps_open_and_new() -> None:
    clock = FakeClock(0.0)
    conns = ConnectionLimiter(max_open=2, per_minute=3, clock=clock)
    assert conns.acquire("ip") and conns.acquire("ip")
    assert not conns.acquire("ip")  # two open
    assert conns.acquire("other")
    conns.release("ip")
    assert conns.acquire("ip")  # the third new one this minute
    conns.release("ip")
    assert not conns.acquire("ip")  # one open, but the rate is spent
    assert conns.retry_after("ip") >= 1
    clock.advance(20)
    assert conns.acquire("ip")
    conns.release("ip")
    conns.release("ip")
    conns.release("ip")  # extra releases do not go negative
    assert "ip" not in conns.open
