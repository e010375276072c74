"""Who reduces how much of the vector: butterfly all-reduce load balancing. Pure functions.

In a butterfly all-reduce of ``N`` elements among ``n`` peers, peer ``i`` reduces ``x_i`` elements: it
sends the ``N - x_i`` elements it does not reduce (and receives their average back), and receives
``x_i`` elements from each of the other ``n - 1`` peers (and sends the average back). With full-duplex
links of bandwidth ``b_i`` (elements per second each way) peer ``i`` needs ``(N + (n - 2) x_i) / b_i``
seconds. The round takes as long as its slowest peer, so the parts solve the linear program (DeDLOC,
section 3.2)::

    minimise T  subject to  N + (n - 2) x_i <= T b_i,   sum x_i = N,   x_i >= 0,   x_i = 0 for clients

Its solution has a closed form (water filling): for the ``k`` fastest reducers ``T_k = N (n - 2 + k) /
sum(b_1..b_k)`` with ``x_i = (T_k b_i - N) / (n - 2)``; the optimum is the smallest ``T_k`` whose ``k``
parts are all non-negative. Solving it exactly in ~20 lines beats a dependency on scipy's ``linprog`` (an
iterative solver whose degenerate-case answers may differ between versions, while every member must
agree on the parts) and keeps the function cheap enough to call per round. With ``n = 2`` every split
takes ``N / b`` and the parts follow the bandwidths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["balance_parts", "peer_traffic", "round_time_bound"]


def _ideal_parts(vector_size: int, bandwidths: Sequence[float], group_size: int) -> list[float]:
    reducers = [i for i, b in enumerate(bandwidths) if b > 0]
    if not reducers:
        raise ValueError("a group needs at least one peer that reduces (bandwidth > 0)")
    n = group_size
    if n <= 2 or len(reducers) == 1:
        total = sum(bandwidths[i] for i in reducers)
        return [vector_size * b / total if b > 0 else 0.0 for b in bandwidths]
    order = sorted(reducers, key=lambda i: (-bandwidths[i], i))
    best: tuple[float, int] | None = None
    running = 0.0
    for k, i in enumerate(order, start=1):
        running += bandwidths[i]
        t = vector_size * (n - 2 + k) / running
        if t * bandwidths[order[k - 1]] >= vector_size * (1 - 1e-12) and (best is None or t < best[0]):
            best = (t, k)
    assert best is not None  # k = 1 is always feasible: T_1 b_1 = N (n - 1) >= N
    t, k = best
    chosen = set(order[:k])
    return [max(0.0, (t * bandwidths[i] - vector_size) / (n - 2)) if i in chosen else 0.0 for i in range(n)]


def balance_parts(vector_size: int, bandwidths: Sequence[float]) -> tuple[int, ...]:
    """Integer part sizes (summing to ``vector_size``) for peers with these bandwidths; 0 = client.

    Rounding is deterministic (largest remainders, ties to the lower index), so every peer that runs
    this on the same input gets the same parts.
    """
    if vector_size < 0:
        raise ValueError("vector_size must be >= 0")
    if any(not math.isfinite(b) or b < 0 for b in bandwidths):
        raise ValueError("bandwidths must be finite and >= 0")
    ideal = _ideal_parts(vector_size, bandwidths, len(bandwidths))
    floors = [math.floor(x) for x in ideal]
    short = vector_size - sum(floors)
    by_remainder = sorted(
        (i for i, b in enumerate(bandwidths) if b > 0), key=lambda i: (-(ideal[i] - floors[i]), i)
    )
    for j in range(short):
        floors[by_remainder[j % len(by_remainder)]] += 1
    return tuple(floors)


def peer_traffic(parts: Sequence[int]) -> list[int]:
    """Elements each peer sends in a round (and receives as many): ``N + (n - 2) x_i``, its vector but
    its own part to the reducers and its part's average to the ``n - 1`` others (a client: ``N``)."""
    n, vector_size = len(parts), sum(parts)
    return [vector_size + (n - 2) * x if n > 1 else 0 for x in parts]


def round_time_bound(
    parts: Sequence[int], bandwidths: Sequence[float], bytes_per_element: float = 1.0
) -> float:
    """Seconds the slowest peer needs to move its traffic at its bandwidth (the LP's objective).

    ``parts`` in elements (they sum to the vector's size); ``bandwidths`` in bytes per second, each
    element costing ``bytes_per_element`` on the wire (1.0: bandwidths in elements per second); each
    peer's traffic is :func:`peer_traffic`. A client (bandwidth 0) is rated at the slowest reducer's
    bandwidth. Taking one unit for both is what keeps a float32 bound from counting the vector in
    bytes and the parts in elements.
    """
    slowest = min(b for b in bandwidths if b > 0)
    return max(
        elements * bytes_per_element / (b if b > 0 else slowest)
        for elements, b in zip(peer_traffic(parts), bandwidths, strict=True)
    )
