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

Share cap: bandwidths are each peer's own claim (what it measured of its own rounds), and a reducer
computes, and could forge, the average of its whole part. So no peer's part exceeds ``max_share`` of
the vector (default :func:`~.robust.max_share`: ``max(2 / n, 1 / reducers)``, at most 1): a claim of
1e300 bytes/s buys at most twice an even share, which is also all an honest peer twice as fast as the
average would need. With the cap the LP gains ``x_i <= C``; its solution fills the same way with the
capped peers fixed at ``C`` (a capped peer stays capped as the others' time grows, so capping the
violators and solving again, at most ``n`` times, reaches the optimum).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .robust import max_share as default_share

__all__ = ["balance_parts", "peer_traffic", "round_time_bound"]


def _fill(total: float, constant: float, bandwidths: dict[int, float], n: int) -> dict[int, float]:
    """The LP's water filling for ``total`` elements among the reducers in ``bandwidths``, each peer's
    time being ``(constant + (n - 2) x_i) / b_i``."""
    if n <= 2 or len(bandwidths) == 1:
        whole = sum(bandwidths.values())
        return {i: total * b / whole for i, b in bandwidths.items()}
    order = sorted(bandwidths, key=lambda i: (-bandwidths[i], i))
    best: tuple[float, int] | None = None
    running = 0.0
    for k, i in enumerate(order, start=1):
        running += bandwidths[i]
        t = (constant * k + (n - 2) * total) / running
        if t * bandwidths[order[k - 1]] >= constant * (1 - 1e-12) and (best is None or t < best[0]):
            best = (t, k)
    if best is None:  # nothing left to share out (total 0 after capping): nobody else reduces
        return dict.fromkeys(bandwidths, 0.0)
    t, k = best
    chosen = set(order[:k])
    return {i: max(0.0, (t * b - constant) / (n - 2)) if i in chosen else 0.0 for i, b in bandwidths.items()}


def _ideal_parts(vector_size: int, bandwidths: Sequence[float], cap: float) -> list[float]:
    reducers = {i: b for i, b in enumerate(bandwidths) if b > 0}
    if not reducers:
        raise ValueError("a group needs at least one peer that reduces (bandwidth > 0)")
    n = len(bandwidths)
    capped: set[int] = set()
    while True:
        free = {i: b for i, b in reducers.items() if i not in capped}
        parts = _fill(vector_size - cap * len(capped), vector_size, free, n) if free else {}
        over = {i for i, x in parts.items() if x > cap * (1 + 1e-12)}
        if not over:
            break
        capped |= over
    return [cap if i in capped else parts.get(i, 0.0) for i in range(n)]


def balance_parts(
    vector_size: int, bandwidths: Sequence[float], max_share: float | None = None
) -> tuple[int, ...]:
    """Integer part sizes (summing to ``vector_size``) for peers with these bandwidths; 0 = client.

    No part exceeds ``ceil(max_share * vector_size)`` elements (default :func:`~.robust.max_share` of
    the group's size and reducers; a share below ``1 / reducers`` is raised to it, so the parts still
    cover the vector). Rounding is deterministic (largest remainders, ties to the lower index), so
    every peer that runs this on the same input gets the same parts.
    """
    if vector_size < 0:
        raise ValueError("vector_size must be >= 0")
    if any(not math.isfinite(b) or b < 0 for b in bandwidths):
        raise ValueError("bandwidths must be finite and >= 0")
    reducers = sum(1 for b in bandwidths if b > 0)
    share = default_share(len(bandwidths), reducers) if max_share is None else max_share
    share = min(1.0, max(share, 1.0 / max(1, reducers)))
    ideal = _ideal_parts(vector_size, bandwidths, share * vector_size)
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
