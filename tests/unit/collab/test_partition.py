"""Load balancing: the closed-form LP solution against brute force, integer rounding, clients."""

import itertools

import pytest

from engine.collab.partition import balance_parts, round_time_bound


def brute_force_best(n_elems: int, bandwidths: list[float]) -> float:
    best = float("inf")
    step = n_elems // 20
    reducers = [i for i, b in enumerate(bandwidths) if b > 0]
    for split in itertools.product(range(0, n_elems + 1, step), repeat=len(reducers) - 1):
        if sum(split) > n_elems:
            continue
        parts = [0] * len(bandwidths)
        for i, x in zip(reducers, [*split, n_elems - sum(split)], strict=True):
            parts[i] = x
        best = min(best, round_time_bound(parts, bandwidths))
    return best


@pytest.mark.parametrize(
    "bandwidths",
    [[1.0, 1.0, 1.0, 1.0], [4.0, 2.0, 1.0, 1.0], [10.0, 1.0, 0.0], [3.0, 3.0, 0.0, 0.0], [5.0, 0.5, 0.5]],
)
def test_closed_form_matches_brute_force(bandwidths: list[float]) -> None:
    n = 2000
    parts = balance_parts(n, bandwidths)
    assert sum(parts) == n
    assert all(p == 0 for p, b in zip(parts, bandwidths, strict=True) if b == 0)
    assert round_time_bound(parts, bandwidths) <= brute_force_best(n, bandwidths) * 1.001


def test_equal_bandwidths_split_equally_and_slow_peers_reduce_less() -> None:
    assert balance_parts(1000, [2.0, 2.0, 2.0, 2.0]) == (250, 250, 250, 250)
    fast, slow = balance_parts(1000, [8.0, 1.0, 8.0])[:2]
    assert fast > slow
    # very slow peers get nothing: they would be the bottleneck even as clients
    assert balance_parts(1000, [100.0, 100.0, 100.0, 0.01])[3] == 0


def test_rounding_is_deterministic_and_exact() -> None:
    for n in (0, 1, 7, 1001):
        parts = balance_parts(n, [1.0, 1.0, 1.0])
        assert sum(parts) == n and parts == balance_parts(n, [1.0, 1.0, 1.0])


def test_two_peers_follow_bandwidth() -> None:
    assert balance_parts(300, [2.0, 1.0]) == (200, 100)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        balance_parts(10, [0.0, 0.0])
    with pytest.raises(ValueError, match="finite"):
        balance_parts(10, [float("nan"), 1.0])
    with pytest.raises(ValueError, match=">= 0"):
        balance_parts(-1, [1.0])


def test_bound_counts_parts_and_vector_in_one_unit() -> None:
    # 4 equal peers, 1,000 float32 elements at 1,000 bytes/s each: every peer sends its 750 elements
    # to the reducers and 3 x 250 averaged elements back, 1,500 elements = 6,000 bytes = 6 s.
    parts = (250, 250, 250, 250)
    assert round_time_bound(parts, [1000.0] * 4, bytes_per_element=4) == pytest.approx(6.0)
    assert round_time_bound(parts, [1000.0] * 4) == pytest.approx(1.5)  # bandwidths in elements/s
    # A client's own traffic is its whole vector out and back, rated at the slowest reducer.
    assert round_time_bound((0, 500, 500), [0.0, 100.0, 200.0]) == pytest.approx(max(1000 / 100, 1500 / 100))
