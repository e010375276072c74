"""The tray app's idle reading: preferred while fresh, extrapolated between feeds, ignored once stale."""

from __future__ import annotations

import math

import pytest

from engine.resources import FedIdle, IdleReading


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_fresh_feed_wins_and_grows_with_time() -> None:
    clock = Clock()
    idle = FedIdle(lambda: IdleReading(None, "no display"), fresh_s=10, mono=clock)
    assert idle.read() == IdleReading(None, "no display") and idle.source is None
    idle.feed(30.0, "app:x11")
    clock.t += 4
    assert idle.read().seconds == pytest.approx(34.0)
    assert idle.source == "app:x11"


def test_stale_feed_falls_back_to_the_nodes_own_reading() -> None:
    clock = Clock()
    idle = FedIdle(lambda: IdleReading(5.0), fresh_s=10, mono=clock)
    idle.feed(3600.0, "app:windows")
    clock.t += 10.5  # the app stopped feeding: a hung app must not keep the node believing nobody is there
    assert idle.read().seconds == 5.0
    assert idle.source is None


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 1e12, True, "5"])
def test_implausible_feeds_are_refused_and_change_nothing(bad: object) -> None:
    clock = Clock()
    idle = FedIdle(lambda: IdleReading(7.0), mono=clock)
    with pytest.raises(ValueError):
        idle.feed(bad, "app")  # type: ignore[arg-type]
    assert idle.read().seconds == 7.0 and idle.feeds == 0
