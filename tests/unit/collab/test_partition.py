"""Load balancing: the closed-form LP solution against brute force, integer rounding, clients, and the
cap on any one peer's share (a claimed bandwidth of 1e300 buys at most twice an even share)."""

import itertools
import math

import pytest

from engine.collab.partition import balance_parts, round_time_bound
from engine.collab.robust import max_share


def brute_force_best(n_elems: int, bandwidths: list[float], cap: float = math.inf) -> float:
    best = float("inf")
    step = n_elems // 20
    reducers = [i for i, b in enumerate(bandwidths) if b > 0]
    for split in itertools.product(range(0, n_elems + 1, step), repeat=len(reducers) - 1):
        if sum(split) > n_elems:
            continue
        parts = [0] * len(bandwidths)
        for i, x in zip(reducers, [*split, n_elems - sum(split)], strict=True):
            parts[i] = x
        if max(parts) <= cap:
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
    reducers = sum(1 for b in bandwidths if b > 0)
    cap = math.ceil(max_share(len(bandwidths), reducers) * n)
    assert max(parts) <= cap
    assert round_time_bound(parts, bandwidths) <= brute_force_best(n, bandwidths, cap) * 1.001
    uncapped = balance_parts(n, bandwidths, max_share=1.0)  # the LP alone, as before the cap
    assert round_time_bound(uncapped, bandwidths) <= brute_force_best(n, bandwidths) * 1.001


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


def test_a_claimed_bandwidth_of_1e300_buys_at_most_twice_an_even_share() -> None:
    honest = [1e7] * 7
    parts = balance_parts(80_000, [1e300, *honest])
    assert sum(parts) == 80_000
    assert parts[0] <= math.ceil(80_000 * 2 / 8)  # 2/n of the vector, not all of it
    assert all(p > 0 for p in parts[1:])
    # before the cap, the claim took the whole vector
    assert balance_parts(80_000, [1e300, *honest], max_share=1.0)[0] == 80_000
    # three peers: a share of 2/3 at most
    assert balance_parts(3000, [1e300, 1.0, 1.0])[0] == 2000


def test_the_cap_never_leaves_elements_unassigned() -> None:
    # one reducer and clients: it takes everything whatever the cap (1 / reducers wins)
    assert balance_parts(1000, [5.0, 0.0, 0.0, 0.0]) == (1000, 0, 0, 0)
    assert balance_parts(1000, [5.0, 1.0, 0.0, 0.0, 0.0, 0.0], max_share=0.1) == (500, 500, 0, 0, 0, 0)
    for bandwidths in ([1e300, 1e-3, 1e-3, 1e-3], [1.0, 2.0, 3.0, 1e9, 0.0]):
        parts = balance_parts(12_345, bandwidths)
        assert sum(parts) == 12_345 and max(parts) <= math.ceil(12_345 * max_share(len(bandwidths)))
