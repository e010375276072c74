"""The signaling client's reconnect delay: exponential, capped, half of it random."""

from __future__ import annotations

import random

from engine.p2p.signaling import reconnect_delay


def test_doubles_up_to_the_cap_and_keeps_at_least_half() -> None:
    assert [reconnect_delay(n, 30.0, rand=lambda: 1.0) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert [reconnect_delay(n, 30.0, rand=lambda: 0.0) for n in range(7)] == [0.5, 1, 2, 4, 8, 15, 15]


def test_a_thousand_peers_spread_over_the_window() -> None:
    rng = random.Random(7)
    delays = sorted(reconnect_delay(0, 30.0, rand=rng.random) for _ in range(1000))
    assert delays[0] >= 0.5 and delays[-1] <= 1.0
    # Not a burst: no tenth of the window holds more than a fifth of the peers.
    buckets = [sum(1 for d in delays if 0.5 + i * 0.05 <= d < 0.55 + i * 0.05) for i in range(10)]
    assert max(buckets) < 200


def test_a_try_that_took_long_counts_toward_the_wait() -> None:
    # The backoff runs from the start of the failed try: a 10 s timeout already waited the 1-8 s.
    assert reconnect_delay(3, 30.0, rand=lambda: 1.0, spent=10.0) == 0.0
    assert reconnect_delay(5, 30.0, rand=lambda: 1.0, spent=10.0) == 20.0
    assert reconnect_delay(2, 30.0, rand=lambda: 0.0, spent=0.5) == 1.5
    # A quick refusal (a 503 answered at once) waits the whole backoff, as before; never negative.
    assert reconnect_delay(4, 30.0, rand=lambda: 1.0, spent=0.0) == 16.0
    assert reconnect_delay(0, 30.0, rand=lambda: 1.0, spent=-5.0) == 1.0
