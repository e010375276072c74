import math

import pytest

from coordinator.credit.ledger import (
    DAY_S,
    HALF_LIFE_S,
    add_credit,
    day_of,
    decay,
    experiment_of,
    rac_per_day,
    receipt_credit,
)


def test_decay_halves_every_half_life() -> None:
    assert decay(100.0, 0.0, HALF_LIFE_S) == pytest.approx(50.0)
    assert decay(100.0, 1000.0, 1000.0 + 3 * HALF_LIFE_S) == pytest.approx(12.5)
    assert decay(100.0, 0.0, 0.0) == 100.0
    assert decay(100.0, 10.0, 5.0) == 100.0  # the past: never grows
    assert decay(0.0, 0.0, 1e9) == 0.0


def test_add_credit_decays_then_adds() -> None:
    value, at = add_credit(100.0, 0.0, 10.0, HALF_LIFE_S)
    assert value == pytest.approx(60.0) and at == HALF_LIFE_S
    # An update stamped before the stored time does not move the clock back.
    value, at = add_credit(100.0, 50.0, 10.0, 40.0)
    assert value == pytest.approx(110.0) and at == 50.0


def test_steady_credit_converges_to_rac_per_day() -> None:
    recent, at = 0.0, 0.0
    for day in range(1, 200):
        recent, at = add_credit(recent, at, 1000.0, day * DAY_S)
    # Daily grants of 1000: the per-day average is ~1000 (discrete grants: within a few percent).
    assert rac_per_day(recent) == pytest.approx(1000.0, rel=0.06)
    assert rac_per_day(recent) == pytest.approx(1000.0 * math.log(2) / 7 / (1 - 2 ** (-1 / 7)), rel=1e-6)


def test_receipt_credit_and_helpers() -> None:
    assert receipt_credit(10, False, 1.5) == 15.0
    assert receipt_credit(10, True, 1.5) == 30.0
    assert day_of(DAY_S * 3 + 5) == 3
    assert experiment_of("mnist.3.4") == "mnist"
