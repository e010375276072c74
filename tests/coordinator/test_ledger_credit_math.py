"""The ledger's credit math at its edges, without a database (issue 17: every credit counter pinned).

``_precheck``, ``rules.withheld_by``, ``_recent_params`` and the per-subject sums are what ``ingest``
applies to each receipt; the database tests run them end to end, these pin each bound and each sum.
"""

import math

import pytest

from coordinator.credit.credit_plan import _Delta, _recent_params
from coordinator.credit.ledger import (
    DAY_S,
    HALF_LIFE_S,
    MAX_AGE_S,
    MAX_SAMPLES,
    MAX_SKEW_S,
    CreditPlan,
    IngestResult,
    _precheck,
    add_credit,
    day_of,
    decay,
    experiment_of,
    rac_per_day,
    receipt_credit,
)
from coordinator.credit.receipts import SignedReceipt
from coordinator.credit.rules import withheld_by

NOW = 1_800_000_000.0
TRAINER, HOST = "aa" * 20, "bb" * 20


def receipt(
    samples: int = 10, served_at: float = NOW, trainer: str = TRAINER, host: str = HOST
) -> SignedReceipt:
    return SignedReceipt(
        receipt_id="0" * 32,
        trainer_peer_id=trainer,
        trainer_public_key=bytes(32),
        host_peer_id=host,
        expert_uid="mnist.0.1",
        samples=samples,
        backward=False,
        served_at=served_at,
        signature=bytes(64),
    )


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"samples": 1}, None),
        ({"samples": MAX_SAMPLES}, None),
        ({"samples": 0}, "bad_samples"),
        ({"samples": -1}, "bad_samples"),
        ({"samples": MAX_SAMPLES + 1}, "bad_samples"),
        ({"served_at": NOW + MAX_SKEW_S}, None),
        ({"served_at": NOW + MAX_SKEW_S + 0.5}, "future"),
        ({"served_at": NOW - MAX_AGE_S}, None),
        ({"served_at": NOW - MAX_AGE_S - 0.5}, "too_old"),
        ({"host": TRAINER}, "self_receipt"),
    ],
)
def test_precheck_bounds_are_inclusive(kwargs: dict[str, object], reason: str | None) -> None:
    assert _precheck(receipt(**kwargs), NOW) == reason  # type: ignore[arg-type]


def test_precheck_limits_are_the_documented_ones() -> None:
    assert (MAX_SAMPLES, MAX_SKEW_S, MAX_AGE_S) == (1_000_000, 300.0, 30 * 86400.0)


def test_spot_check_period_covers_both_ends() -> None:
    # One reporter (account 7) withholds its own receipts only, over both ends of its periods.
    flags = [(10.0, 20.0, 7), (40.0, 50.0, 7)]
    assert [withheld_by(flags, t, 7) for t in (9.9, 10.0, 15.0, 20.0, 20.1, 40.0, 50.0, 50.1)] == [
        False,
        True,
        True,
        True,
        False,
        True,
        True,
        False,
    ]
    assert not withheld_by(flags, 15.0, 8)  # another trainer's receipt: one reporter is not enough
    assert not withheld_by([], 10.0, 7)


def test_two_reporters_withhold_everyones_receipts_where_they_overlap() -> None:
    flags = [(10.0, 30.0, 7), (20.0, 40.0, 8)]
    assert [withheld_by(flags, t, 9) for t in (15.0, 20.0, 30.0, 35.0)] == [False, True, True, False]
    assert not withheld_by([(10.0, 30.0, 7), (10.0, 30.0, 7)], 15.0, 9)  # one account twice is one


def test_decay_of_one_credit() -> None:
    # value == 0 is the only value returned as is; a mutant treating 1.0 so would keep it undecayed.
    assert decay(1.0, 0.0, HALF_LIFE_S) == pytest.approx(0.5)
    assert decay(-8.0, 0.0, 2 * HALF_LIFE_S) == pytest.approx(-2.0)
    assert decay(100.0, 0.0, HALF_LIFE_S, half_life=HALF_LIFE_S / 2) == pytest.approx(25.0)


def test_add_credit_at_the_stored_time_adds_without_decay() -> None:
    assert add_credit(100.0, 50.0, 10.0, 50.0) == (110.0, 50.0)
    value, at = add_credit(100.0, 0.0, 10.0, 2 * HALF_LIFE_S, half_life=2 * HALF_LIFE_S)
    assert (value, at) == (pytest.approx(60.0), 2 * HALF_LIFE_S)


def test_rac_per_day_formula() -> None:
    assert rac_per_day(7.0) == pytest.approx(math.log(2))
    assert rac_per_day(10.0, half_life=2 * DAY_S) == pytest.approx(5 * math.log(2))


def test_receipt_credit_forward_and_backward() -> None:
    assert receipt_credit(3, False, 2.0) == 6.0
    assert receipt_credit(3, True, 2.0) == 12.0
    assert receipt_credit(1, False, 1.0) == 1.0


def test_day_and_experiment_helpers_at_their_edges() -> None:
    assert day_of(0.0) == 0
    assert day_of(DAY_S - 0.001) == 0
    assert day_of(DAY_S) == 1
    assert day_of(-1.0) == -1  # floored, not truncated: the day before the epoch is -1
    assert isinstance(day_of(DAY_S * 2.5), int)
    assert experiment_of("mnist.3.4") == "mnist"
    assert experiment_of("a b.c") == "a b"
    assert experiment_of("plain") == "plain"


def test_recent_params_decay_add_and_never_go_negative() -> None:
    delta = _Delta(total=5.0, recent=3.0, requests=2)
    assert _recent_params(8.0, 0.0, delta, HALF_LIFE_S) == {"amt": 5.0, "rec": 7.0, "rat": HALF_LIFE_S}
    # Credit taken back (negative) cannot push the recent credit below zero.
    back = _Delta(total=-50.0, recent=-50.0)
    assert _recent_params(8.0, 100.0, back, 50.0) == {"amt": -50.0, "rec": 0.0, "rat": 100.0}


def test_delta_and_plan_sum_per_subject_and_day() -> None:
    d = _Delta(1.0, 2.0, 3)
    d.add(_Delta(10.0, 20.0, 30))
    assert (d.total, d.recent, d.requests) == (11.0, 22.0, 33)
    plan = CreditPlan()
    plan.add("h1", 4.0, 3.0, 1, day=7)
    plan.add("h1", 6.0, 5.0, 2, day=7)
    plan.add("h1", 1.0, 1.0, 1, day=8)
    plan.add("h2", 2.0, 2.0, 1, day=7)
    h1 = plan.hosts["h1"]
    assert (h1.total, h1.recent, h1.requests) == (11.0, 9.0, 4)
    assert dict(plan.days) == {("h1", 7): 10.0, ("h1", 8): 1.0, ("h2", 7): 2.0}


def test_ingest_result_json() -> None:
    r = IngestResult(accepted=3, duplicates=1, withheld=2, rejected=[("ab", "future")], credit=4.5)
    assert r.to_json() == {
        "accepted": 3,
        "duplicates": 1,
        "withheld": 2,
        "credit": 4.5,
        "rejected": [{"receipt_id": "ab", "reason": "future"}],
    }
