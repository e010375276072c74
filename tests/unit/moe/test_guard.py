"""The host's bounds against bad trainers as pure policy (engine.moe.guard): numbers in, decisions out."""

import math

import pytest

from engine.moe import GradientTooLarge, GuardConfig, OverShare
from engine.moe.guard import JumpDetector, NormBound, ShareWindow, row_rms

CONFIG = GuardConfig(norm_multiple=4.0, norm_window=64, norm_warmup=8, jump_multiple=5.0, jump_warmup=4)


def warm(bound: NormBound, peers: int = 4, rounds: int = 4, size: float = 1.0) -> None:
    for r in range(rounds):
        for p in range(peers):
            bound.admit(f"peer{p}", size * (1 + 0.1 * ((r + p) % 3)))


def test_row_rms_is_independent_of_the_request_size() -> None:
    assert row_rms(4.0 * 10, 10) == pytest.approx(2.0)
    assert row_rms(4.0, 1) == row_rms(40.0, 10)
    assert row_rms(-1e-12, 3) == 0.0  # rounding below zero is not an error


def test_no_bound_while_warming_up_or_with_one_trainer() -> None:
    bound = NormBound(CONFIG)
    for _ in range(20):
        bound.admit("alone", 1.0)
    assert bound.bound is None  # one trainer: nobody to protect from it
    bound.admit("alone", 1e6)  # so this passes
    fresh = NormBound(CONFIG)
    fresh.admit("a", 1.0)
    fresh.admit("b", 1.0)
    assert fresh.bound is None  # 2 of the 8 warm-up requests
    fresh.admit("b", 1e6)


def test_a_gradient_over_the_multiple_is_refused_and_recorded_at_the_bound() -> None:
    bound = NormBound(CONFIG)
    warm(bound)
    limit = bound.bound
    assert limit is not None and 4.0 <= limit <= 4.0 * 1.2
    assert bound.admit("peer0", limit * 0.99) < 1.0  # just under: taken, clipped
    limit = bound.bound
    assert limit is not None
    with pytest.raises(GradientTooLarge, match="over 4 x the expert's recent typical size") as e:
        bound.admit("attacker", 1000.0)
    assert e.value.code == "grad_too_large"
    assert bound._recorded[-1] == ("attacker", limit)  # its vote is the bound, not 1000


def test_sizes_between_the_clip_and_the_refusal_are_scaled_to_the_clip() -> None:
    bound = NormBound(CONFIG)
    assert bound.admit("early", 1e6) == 1.0  # warming up: nothing is clipped
    bound = NormBound(CONFIG)
    warm(bound, size=1.0)
    typical = bound.typical
    assert typical is not None
    assert bound.admit("peer1", typical) == 1.0
    typical = bound.typical
    assert typical is not None
    scale = bound.admit("peer2", 3 * typical)  # clip 2 x, refusal 4 x
    assert scale == pytest.approx(2 / 3)


def test_the_typical_size_is_a_mean_per_trainer_so_heavy_tails_do_not_refuse_honest_work() -> None:
    """Most rows near zero and a few large: a median per trainer sat on the zeros; the mean does not."""
    bound = NormBound(CONFIG)
    for r in range(16):
        for p in range(4):
            bound.admit(f"peer{p}", 2.0 if (r + p) % 4 == 0 else 0.01)
    assert bound.admit("peer0", 2.0) == 1.0  # a hard example, as honest trainers send every fourth time


def test_many_requests_of_a_minority_do_not_move_the_bound() -> None:
    bound = NormBound(CONFIG)
    warm(bound, peers=5)
    before = bound.bound
    assert before is not None
    for _ in range(500):  # two attackers flood the window with refusals at (and under) the bound
        for attacker in ("evil1", "evil2"):
            with pytest.raises(GradientTooLarge):
                bound.admit(attacker, 1e9)
        bound.admit(f"peer{_ % 5}", 1.0)
    after = bound.bound
    assert after is not None and after <= before * 1.2


def test_a_change_of_scale_that_every_trainer_shares_is_followed() -> None:
    """The loss jumps for everyone: refused at first, then the median climbs and they pass again."""
    bound = NormBound(CONFIG)
    warm(bound)
    refused = 0
    for r in range(200):
        try:
            bound.admit(f"peer{r % 4}", 100.0)
        except GradientTooLarge:
            refused += 1
    assert 0 < refused < 150
    bound.admit("peer0", 100.0)


def test_nan_size_is_refused_and_not_recorded() -> None:
    bound = NormBound(CONFIG)
    with pytest.raises(GradientTooLarge, match="not a number"):
        bound.admit("p", math.nan)
    assert not bound._recorded


def test_share_cap_is_a_multiple_of_the_median_trainer() -> None:
    window = ShareWindow(GuardConfig(share_multiple=2.0, share_window=100))
    window.admit("a", 30)
    window.admit("b", 10)
    assert window.cap("a", 10) is None  # two trainers: no majority to protect
    window.admit("c", 10)
    assert window.cap("a", 10) == 20  # median of 40, 10, 10
    for p in "defgh":
        window.admit(p, 8)
    assert window.cap("z", 8) == 16  # the median trainer holds 8


def test_no_bound_until_the_window_is_half_full() -> None:
    window = ShareWindow(GuardConfig(share_window=1000))
    for p in "abc":
        window.admit(p, 10)
    for _ in range(10):
        window.admit("early", 40)  # 430 of 1000: still warming up
    with pytest.raises(OverShare):
        window.admit("early", 100)


def test_one_trainer_alone_is_never_refused() -> None:
    window = ShareWindow(GuardConfig(share_window=64))
    for _ in range(100):
        window.admit("only", 16)
    assert window.share("only") == 1.0


def test_a_trainer_over_its_share_is_refused_and_nothing_is_counted() -> None:
    window = ShareWindow(GuardConfig(share_multiple=2.0, share_window=1000))
    for _ in range(20):
        for p in range(8):
            window.admit(f"honest{p}", 10)
    taken = refused = 0
    for _ in range(50):
        for _ in range(4):  # four times an honest trainer's updates
            held = window._by_peer.get("greedy", 0)
            try:
                window.admit("greedy", 10)
                taken += 1
            except OverShare as e:
                assert e.code == "over_share" and "at most 2 x the median trainer's (" in str(e)
                assert window._by_peer.get("greedy", 0) == held  # nothing counted
                refused += 1
        for p in range(8):
            window.admit(f"honest{p}", 10)
    assert refused > 0 and taken > 0
    assert window._by_peer["greedy"] <= 2 * window._by_peer["honest0"]


def test_many_small_requests_are_bounded_by_the_request_count() -> None:
    """One row at a time stays under the sample cap, not under the requests'."""
    window = ShareWindow(GuardConfig(share_multiple=2.0, share_window=900))
    for _ in range(10):
        for p in range(6):
            window.admit(f"honest{p}", 8)
    assert window.request_cap("drip") == 2 * 10
    with pytest.raises(OverShare, match="backwards in the expert's window"):
        for _ in range(30):
            window.admit("drip", 1)
    assert window._requests["drip"] <= 20 and window._by_peer["drip"] <= 20


def test_the_window_slides_and_forgets_old_trainers() -> None:
    window = ShareWindow(GuardConfig(share_window=40))
    window.admit("old", 30)
    for _ in range(10):
        window.admit("new", 5)
    assert window.share("old") == 0.0 and window._total <= 40
    assert "old" not in window._by_peer


def test_jump_after_warm_up_only_and_recorded_at_the_bound() -> None:
    detector = JumpDetector(CONFIG)
    for _ in range(4):
        assert not detector.judge(1.0)
    assert detector.bound == 5.0
    assert not detector.judge(4.9)
    assert detector.judge(50.0)
    assert max(detector._moves) <= 5.0
    assert detector.judge(math.nan) and detector.judge(math.inf)  # broken weights: always a jump


def test_a_lasting_change_of_pace_stops_being_a_jump() -> None:
    detector = JumpDetector(GuardConfig(jump_multiple=2.0, jump_window=8, jump_warmup=2))
    for _ in range(8):
        detector.judge(1.0)
    jumps = [detector.judge(10.0) for _ in range(20)]
    assert jumps[0] and not jumps[-1]


@pytest.mark.parametrize(
    "fields",
    [
        {"norm_multiple": 1.0},
        {"jump_multiple": 0.5},
        {"share_multiple": 0.5},
        {"clip_multiple": 0.5},
        {"clip_multiple": 9.0},
        {"norm_window": 0},
        {"probe_every": 0},
        {"jump_warmup": 0},
        {"norm_warmup": -1},
    ],
)
def test_impossible_configs_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        GuardConfig(**fields)  # type: ignore[arg-type]
