"""What one member can sway: CenteredClip, bounded weights, the share cap. Pure tensor functions.

**CenteredClip** (Karimireddy, He & Jaggi, "Learning from History for Byzantine Robust Optimization",
ICML 2021; used on every part of the butterfly all-reduce by BTARD, Gorbunov et al. 2022). Given the
members' contributions ``x_i`` to one chunk and their weights ``w_i``, start from the coordinate-wise
median ``v_0`` and iterate, ``iterations`` times::

    v <- v + sum_i w_i * clip(x_i - v, tau) / sum_i w_i,      clip(z, tau) = z * min(1, tau / |z|)

A contribution within ``tau`` of ``v`` counts in full, one further away only by ``tau`` in its
direction, so nobody moves the result by more than its weight share times ``tau`` per iteration. When
every contribution lies within ``tau`` of ``v`` throughout, the first iteration gives exactly the
weighted mean and the next ones keep it (to float rounding).

**Radius.** ``tau`` is ``tau_scale`` times the median of the members' distances to ``v_0``, per chunk
(at each round's scale: a fixed radius would have to follow the gradients through training), or
``tau`` when set (absolute, in the vector's units). With fewer than half the members Byzantine, the
median distance is an honest member's distance whatever the others send. The default scale is 1:
about half the honest contributions are clipped a little, and honest members get a robust average
close to their weighted mean, not equal to it (``benchmarks/byzantine.py`` measures the cost: the
honest defended run against the undefended one). A larger radius, which would leave honest members
their exact mean, lets every Byzantine member pull that much further (the bounds below grow with
``tau``): on the digits benchmark (150 steps, one seed, weights bounded by the median), 2 of 8
members sending their gradient times -1000 cost 0.633 of accuracy at scale 3 and 0.014 at scale 1
when claiming the largest weight, 0.072 and 0.003 when claiming a 1e300 bandwidth.

**Weights.** A weight above ``max_weight`` is refused upstream (the reducer excludes its sender); the
rest are bounded by the group: ``w_i' = min(w_i, weight_to_median * median of the positive weights)``,
default 1: no member counts for more than the median member (one with more samples than the median
is counted as the median; one with fewer, by its own). With ``b`` Byzantine members of ``n`` and honest
weights about equal the Byzantine share of the weight is then at most ``delta ~ b / n`` whatever they
claim (``k b / (k b + n - b)`` for ``k = weight_to_median``: 2 would give 3 of 8 members 55%, past any
bound). Members of weight 0 take no part, as in the weighted mean.

**Bounds.** Let ``H`` be the honest members, ``m`` their weighted mean, ``delta < 1/2`` the Byzantine
share of the bounded weight, ``q = delta / (1 - delta)``, ``e_k = |v_k - m|``, ``r = max_h |x_h - m|``.
Along the direction ``u`` from ``m`` to ``v``, the Byzantine terms pull at most ``delta tau`` (each is
at most ``tau`` long); the honest terms pull back.

(a) Honest contributions inside ``tau`` (deterministic, any spread): the honest terms are unclipped and
sum to ``(1 - delta)(m - v_k)``, so ``e_{k+1} <= delta e_k + delta tau``. The condition holds
throughout once ``r + max(e_0, q tau) <= tau``, and then ``|v_L - m| <= delta^L e_0 + q tau``.

(b) Honest contributions clipped (as the default radius does): for high-dimensional noise, honest
deviations about equally long and independent of the attack (``m`` is their mean, so they sum to
zero), at ``v = m + e u`` each honest term is cut by the same factor ``tau / sqrt(r^2 + e^2)``, and the
honest pull is ``(1 - delta) e`` times it. Where the pulls balance, ``e = q r / sqrt(1 - q^2)``.

Together, once the iteration settles::

    |v - m|  <=  q max(tau, r / sqrt(1 - q^2))      (q = 1/3 at delta = 1/4, 3/5 at 3/8)

and since the median distance is an honest one, ``tau`` is about ``tau_scale sqrt(r^2 + e_0^2)``: the
Byzantine members move the result by a fraction of one honest member's own noise, whatever they send
(sign flips, x1000, 1e28, weight 1e9); nothing holds at ``delta >= 1/2``. (b) is a model, not a worst
case: an attacker sending a negated, scaled copy of one honest member's vector (noise correlated with
the attack) gets up to 12% past it in the unit tests. Karimireddy et al. prove ``O(sqrt(delta)
sigma)`` in expectation for honest noise of variance ``sigma^2``. ``iterations`` (default 3) bounds
the work, and the drift when ``delta >= 1/2``. Attacks that stay within the honest spread ("a little is
enough", Baruch et al. 2019) are not clipped; they move the result by at most their weight share of
their offset, within the same bound.

Measured (``benchmarks/byzantine.py --quick``: digits, 8 trainers, 2 or 3 of them malicious, 150
steps, 2 repeats): every attack at 2 of 8 within 0.02 of the honest run's accuracy (worst 0.019: the
largest weight with the gradient times -1000). At 3 of 8 that attack costs 0.10: three members counted
as the median member hold 41% of the weight (``q = 0.70``, the bound about one honest member's whole
noise every step, against the descent direction); with their own weights (25%) the same vectors cost
0.036, and plain sign flips 0.021: three of eight by count put the median start and the radius at an
upper honest order statistic (``e_0`` about ``r``).

Cost: the contributions are stacked once (``members x chunk`` float32, as much again as the reducer
holds), and everything else goes in column blocks of ``BLOCK``: the median's sort, and each
iteration's distances and pulls (``members x BLOCK`` at a time; in float64 when a value is large
enough that its square could overflow float32, as an attacker's 1e28 would). About ``1 + 2 iterations``
passes over the stack, in numpy (a chunk is a few small operations, where torch's per-call cost was
most of the work): 0.3 ms for 8 members x 1,202 elements, 6 ms for 4 x 65,536, 14 ms for 16 x 65,536 on
this project's 2-core test machine, on the reducer's event loop. The digits benchmark's honest
defended run is 6% below the undefended one in samples/s, with the all-reduce in memory (no network).

**Share cap.** :func:`max_share`: no member reduces more than ``max(2 / n, 1 / reducers)`` of the vector
(:mod:`partition`), nor counts for more than ``2 / n`` of an epoch's samples (:mod:`progress`,
:mod:`matchmaking`): twice an even share leaves room for honest members twice as fast as the average,
and keeps what one member could forge or claim to that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["BLOCK", "CenteredClipConfig", "ClipReport", "bounded_weights", "centered_clip", "max_share"]

BLOCK = 4096  # columns per block: the median's sort, distances and pulls
OUTLIER = 10.0  # a contribution this many radii away is flagged (counted, not excluded)
SAFE = 1e17  # max |value| x sqrt(chunk) below which differences squared and summed fit float32
SHARE_FACTOR = 2.0


@dataclass(frozen=True)
class CenteredClipConfig:
    """CenteredClip's settings (see the module's docstring for what they bound)."""

    tau: float = 0.0  # absolute radius; 0: tau_scale times the median distance to the median
    tau_scale: float = 1.0
    iterations: int = 3
    weight_to_median: float = 1.0  # a weight counts for at most this times the median positive weight

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tau) and self.tau >= 0):
            raise ValueError("tau must be finite and >= 0")
        if not (math.isfinite(self.tau_scale) and self.tau_scale > 0):
            raise ValueError("tau_scale must be finite and > 0")
        if self.iterations < 1:
            raise ValueError("iterations must be >= 1")
        if not (math.isfinite(self.weight_to_median) and self.weight_to_median > 0):
            raise ValueError("weight_to_median must be finite and > 0")


@dataclass(frozen=True)
class ClipReport:
    tau: float
    distances: tuple[float, ...]  # each contribution's distance at the last iteration, in input order
    clipped: tuple[bool, ...]  # whether it lay beyond tau then (its pull was cut)

    @property
    def outliers(self) -> tuple[bool, ...]:
        """Contributions ``OUTLIER`` radii away or more: farther than any honest member's noise
        plausibly is (honest ones sit about one radius away), so worth counting against their sender.
        Sign flips and "a little is enough" stay within the honest spread and are not flagged."""
        return tuple(d >= OUTLIER * self.tau > 0 for d in self.distances)


def max_share(n: int, reducers: int | None = None) -> float:
    """The largest share of the vector (or of an epoch's samples) one of ``n`` members may take."""
    if n <= 0:
        raise ValueError("a group has at least one member")
    floor = 1.0 / reducers if reducers else 0.0
    return min(1.0, max(SHARE_FACTOR / n, floor))


def bounded_weights(weights: Sequence[float], weight_to_median: float) -> list[float]:
    """Each weight capped at ``weight_to_median`` times the median of the positive ones (pure)."""
    positive = sorted(w for w in weights if w > 0)
    if not positive:
        return [0.0 for _ in weights]
    k = len(positive)
    median = (positive[(k - 1) // 2] + positive[k // 2]) / 2
    cap = weight_to_median * median
    return [min(max(0.0, float(w)), cap) for w in weights]


def _median(x: np.ndarray) -> np.ndarray:
    """Coordinate-wise median of the rows of ``x`` (the mean of the two middle values for an even
    count), block by block."""
    m, d = x.shape
    out = np.empty(d, dtype=np.float32)
    for a, b in _blocks(d):
        block = np.sort(x[:, a:b], axis=0)
        np.add(block[(m - 1) // 2], block[m // 2], out=out[a:b])
    out *= 0.5
    return out


def _blocks(d: int) -> list[tuple[int, int]]:
    return [(a, min(d, a + BLOCK)) for a in range(0, d, BLOCK)]


def _step(
    x: np.ndarray, v: np.ndarray, w: np.ndarray, tau: float | None, scale: float
) -> tuple[np.ndarray, float]:
    """One iteration in place: ``v += sum_i w_i clip(x_i - v, tau)``. ``tau`` None: ``scale`` times the
    median distance, taken here. Returns the distances to ``v`` before the step, and the radius.

    In ``w``'s dtype: float64 once a value is large enough that a difference squared could overflow
    float32 (an attacker's 1e28 must not turn into inf, nor inf times 0 into nan)."""
    dtype = w.dtype
    blocks = _blocks(x.shape[1])
    diff = None
    if len(blocks) == 1:  # one block's worth: the differences once, for the distances and the pull
        diff = x.astype(dtype, copy=False) - v.astype(dtype, copy=False)
        dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    else:
        sq = np.zeros(x.shape[0], dtype=dtype)
        for a, b in blocks:
            part = x[:, a:b].astype(dtype, copy=False) - v[a:b].astype(dtype, copy=False)
            sq += np.einsum("ij,ij->i", part, part)
        dist = np.sqrt(sq)
    if tau is None:
        k = len(dist)
        middle = np.sort(dist)
        tau = scale * float(middle[(k - 1) // 2] + middle[k // 2]) / 2
    if tau <= 0:
        return dist, 0.0  # more than half the contributions coincide: that value is the result
    with np.errstate(divide="ignore"):
        coef = w * np.minimum(1.0, tau / dist).astype(dtype)
    if diff is not None:
        v += (coef @ diff).astype(np.float32)
    else:
        for a, b in blocks:
            part = x[:, a:b].astype(dtype, copy=False) - v[a:b].astype(dtype, copy=False)
            v[a:b] += (coef @ part).astype(np.float32)
    return dist, tau


def centered_clip(
    xs: Sequence[torch.Tensor], weights: Sequence[float], config: CenteredClipConfig
) -> tuple[torch.Tensor, ClipReport]:
    """The robust weighted average of ``xs`` (flat float32 CPU tensors of one size), a new tensor.

    ``weights`` are used as given (bound them first with :func:`bounded_weights`); contributions of
    weight 0 take no part. With every weight 0 the result is zeros, as the weighted sum would be.
    The report's distances are each contribution's from the last iteration's start (what decided
    whether its pull was cut). Computed with numpy on the tensors' memory: a chunk is a few small
    operations, where torch's per-call cost would be most of the work.
    """
    if len(xs) != len(weights) or not xs:
        raise ValueError("one weight per contribution, and at least one contribution")
    d = xs[0].numel()
    live = [i for i, w in enumerate(weights) if w > 0]
    nothing = ClipReport(0.0, (0.0,) * len(xs), (False,) * len(xs))
    if not live:
        return torch.zeros(d, dtype=torch.float32), nothing
    if len(live) == 1 or d == 0:
        return xs[live[0]].reshape(-1).to(torch.float32).clone(), nothing
    x = np.stack([xs[i].reshape(-1).to(torch.float32).numpy() for i in live])  # members x chunk
    wide = float(np.abs(x).max()) * math.sqrt(d) > SAFE
    w = np.array([float(weights[i]) for i in live], dtype=np.float64)
    w = (w / w.sum()).astype(np.float64 if wide else np.float32)
    v = _median(x)
    tau: float | None = config.tau if config.tau > 0 else None
    dist = np.zeros(len(live))
    for _ in range(config.iterations):
        dist, tau = _step(x, v, w, tau, config.tau_scale)
        if tau <= 0:
            break
    radius = tau or 0.0
    all_dist = [0.0] * len(xs)
    clipped = [False] * len(xs)
    for j, i in enumerate(live):
        all_dist[i] = float(dist[j])
        clipped[i] = all_dist[i] > radius * (1 + 1e-6)
    return torch.from_numpy(v), ClipReport(radius, tuple(all_dist), tuple(clipped))
