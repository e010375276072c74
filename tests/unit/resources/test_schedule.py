from datetime import datetime

import pytest

from engine.resources.schedule import ALL_DAY, is_allowed, next_allowed, parse_range, week_intervals

MON = datetime(2025, 7, 14, 10, 30)


def days(**kw: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [kw.get(d, ()) for d in ("mon", "tue", "wed", "thu", "fri", "sat", "sun")]


def test_parse_range() -> None:
    assert parse_range("08:30-17:00") == (510, 1020)
    assert parse_range(ALL_DAY) == (0, 1440)
    for bad in ("8-17", "24:30-25:00", "10:60-11:00", "24:00-01:00"):
        with pytest.raises(ValueError):
            parse_range(bad)


def test_overnight_and_week_wrap() -> None:
    iv = week_intervals(days(sun=("22:00-06:00",)))
    assert is_allowed(iv, datetime(2025, 7, 14, 5, 59))  # Monday early morning
    assert not is_allowed(iv, datetime(2025, 7, 14, 6, 0))
    assert next_allowed(iv, MON) == datetime(2025, 7, 20, 22, 0)


def test_next_allowed_same_day_and_none() -> None:
    iv = week_intervals(days(mon=("12:00-13:00",)))
    assert next_allowed(iv, MON) == datetime(2025, 7, 14, 12, 0)
    assert next_allowed(iv, datetime(2025, 7, 14, 12, 15)) == datetime(2025, 7, 14, 12, 15)
    assert next_allowed(iv, datetime(2025, 7, 14, 13, 0)) == datetime(2025, 7, 21, 12, 0)
    assert next_allowed(week_intervals(days()), MON) is None
