"""What a host holds against trainers that send poison: pure policy over numbers, no torch, no sockets.

An expert learns from whatever gradients trainers send it, and any admitted peer may send them. Three
bounds keep one trainer (or a minority of them) from steering an expert every other trainer uses
(issue 28, item 3); :class:`~.backend.ExpertBackend` applies them, :mod:`.probe` measures the outputs.

**Gradient norm** (:class:`NormBound`). A backward's size is the root mean square over its rows of the
output gradient's row norms (``||g||_F / sqrt(rows)``: independent of the request's batch size). The
recent statistic is robust across trainers: each trainer's root mean square over its last recorded
requests of the expert (within the last ``norm_window``), then the median of those over trainers, so
that a minority of trainers cannot move it however many requests they send. (Per trainer it is a mean,
not a median: a classifier's output gradients are heavy-tailed, most rows near zero and a few hard ones
large, and a median there refused 7% of honest requests in benchmarks/byzantine_experts.py.) After
``norm_warmup`` recorded requests from at least two trainers:

- a backward above ``norm_multiple`` x that statistic is **refused** (:class:`~.errors.GradientTooLarge`):
  no honest request was that far out in the benchmark, and a clipped one would still cast a vote in
  whatever direction it chose;
- a backward above ``clip_multiple`` x the statistic is **clipped** to it: the host scales the output
  gradient down for its weights' update and scales the input gradient it returns back up, so the
  trainer's own backpropagation is exact while no request moves the expert more than ``clip_multiple``
  typical ones of its rows. This bounds a crafted gradient sent just under the refusal bound.

A refused request is recorded at the bound, not at its size, so a lasting change of scale shared by
most trainers raises the statistic (by at most ``norm_multiple`` per window) instead of being refused
forever, while a minority's refusals only raise their own entries. The host's existing clip of each
step's summed gradient (``max_grad_norm``) still applies after this.

**Share of updates** (:class:`ShareWindow`). Over the last ``share_window`` samples of an expert's
accepted backwards, no trainer (peer id) may hold more than ``share_multiple`` x the median trainer's
samples, nor have sent more than ``share_multiple`` x the median trainer's requests (medians over the
trainers in the window, the sender counted with this request: requests too, because an update's pull
is per request as well as per row once :class:`NormBound` has bounded each row). It applies
from three trainers on (with two, the median is their mean and there is no majority to protect) and
once the window holds half its samples. A request that would take its sender over is **refused**
(:class:`~.errors.OverShare`): the host does no work for it, and the sender learns why by its code. A
coalition of ``b`` trainers still holds up to ``b`` such shares: this bounds each, not all.

**Rollback** (:class:`JumpDetector`). Experts have no loss of their own, so the host's probe is the
expert's outputs on a few recent inputs it keeps (:mod:`.probe`): every ``probe_every`` optimizer
steps it measures how far the outputs moved since the last check (root mean square over the probe's
elements). After ``jump_warmup`` checks, a movement above ``jump_multiple`` x the median of the last
``jump_window`` recorded movements is a **jump**: the host restores the weights and optimizer state it
saved at the last check that was not one, which is the last good checkpoint. A jump is recorded at the
bound (as refusals are), so a lasting change of pace raises the median instead of freezing the expert.

Every refusal and rollback is logged with the sender (the rollback with the uid) and counted in the
backend's stats, which the node's status sums (``trainers_refused``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import GradientTooLarge, OverShare

__all__ = ["GuardConfig", "JumpDetector", "NormBound", "ShareWindow", "row_rms"]


@dataclass(frozen=True)
class GuardConfig:
    """The host's bounds against bad trainers; :class:`~.backend.ExpertBackend` takes one or ``None``."""

    norm_multiple: float = 8.0
    clip_multiple: float = 2.0
    norm_window: int = 256
    norm_warmup: int = 32
    share_multiple: float = 2.0
    share_window: int = 2048
    probe_rows: int = 32
    probe_every: int = 8
    jump_multiple: float = 6.0
    jump_window: int = 32
    jump_warmup: int = 8

    def __post_init__(self) -> None:
        if not (self.norm_multiple > 1 and self.jump_multiple > 1 and self.share_multiple >= 1):
            raise ValueError("norm_multiple and jump_multiple must exceed 1, share_multiple be >= 1")
        if not 1 <= self.clip_multiple <= self.norm_multiple:
            raise ValueError("clip_multiple must be in [1, norm_multiple]")
        if min(self.norm_window, self.share_window, self.probe_rows, self.probe_every, self.jump_window) < 1:
            raise ValueError("windows, probe rows and probe_every must be at least 1")
        if self.norm_warmup < 0 or self.jump_warmup < 1:
            raise ValueError("norm_warmup must be >= 0 and jump_warmup >= 1")


def row_rms(squared_norm: float, rows: int) -> float:
    """A request's size: ``sqrt(||g||_F^2 / rows)``, the root mean square of its rows' norms."""
    return math.sqrt(max(squared_norm, 0.0) / max(rows, 1))


def _median_over_trainers(entries: Iterable[tuple[str, float]]) -> float:
    """The median over trainers of each one's root mean square."""
    per_peer: dict[str, list[float]] = {}
    for peer, value in entries:
        per_peer.setdefault(peer, []).append(value * value)
    return float(statistics.median(math.sqrt(sum(v) / len(v)) for v in per_peer.values()))


class NormBound:
    """One expert's bound on a backward's output-gradient size (the module docstring's rule)."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self._recorded: deque[tuple[str, float]] = deque(maxlen=config.norm_window)
        self._count = 0
        self._typical: float | None = None
        self._stale = True

    @property
    def typical(self) -> float | None:
        """The recent statistic (the module docstring's); ``None`` while warming up."""
        if self._stale:
            self._stale = False
            peers = {p for p, _ in self._recorded}
            if self._count < self.config.norm_warmup or len(peers) < 2:
                self._typical = None
            else:
                self._typical = _median_over_trainers(self._recorded)
        return self._typical

    @property
    def bound(self) -> float | None:
        """The size above which a backward is refused now; ``None`` while warming up."""
        typical = self.typical
        return None if typical is None else self.config.norm_multiple * typical

    def admit(self, peer: str, size: float, uid: str = "") -> float:
        """Record ``size`` for ``peer`` and return the scale its gradient takes (1, or less when it is
        clipped); or record the bound and raise :class:`GradientTooLarge`."""
        typical = self.typical
        if not size >= 0.0:  # NaN: the finiteness check refuses those first; here, never recorded
            raise GradientTooLarge(f"{uid}: gradient size {size} from {peer[:16]} is not a number")
        bound = None if typical is None else self.config.norm_multiple * typical
        refused = bound is not None and size > bound
        self._recorded.append((peer, bound if refused and bound is not None else size))
        self._count += 1
        self._stale = True
        if refused:
            raise GradientTooLarge(
                f"{uid}: output gradient of size {size:.4g} per row from {peer[:16]} is over "
                f"{self.config.norm_multiple:g} x the expert's recent typical size ({typical:.4g})"
            )
        if typical is None or size <= self.config.clip_multiple * typical:
            return 1.0
        return self.config.clip_multiple * typical / size


class ShareWindow:
    """One expert's last ``share_window`` accepted samples by trainer (the module docstring's rule)."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self._window: deque[tuple[str, int]] = deque()
        self._by_peer: dict[str, int] = {}
        self._requests: dict[str, int] = {}
        self._total = 0

    def share(self, peer: str) -> float:
        return self._by_peer.get(peer, 0) / self._total if self._total else 0.0

    def cap(self, peer: str, samples: int = 0) -> int | None:
        """The samples ``peer`` may hold in the window with ``samples`` more; ``None``: no bound now."""
        counts = dict(self._by_peer)
        counts[peer] = counts.get(peer, 0) + samples
        if len(counts) < 3 or 2 * (self._total + samples) < self.config.share_window:
            return None
        return math.floor(self.config.share_multiple * statistics.median(counts.values()))

    def request_cap(self, peer: str) -> int | None:
        """The requests ``peer`` may have in the window with one more; ``None``: no bound now."""
        if self.cap(peer) is None:
            return None
        counts = dict(self._requests)
        counts[peer] = counts.get(peer, 0) + 1
        return math.floor(self.config.share_multiple * statistics.median(counts.values()))

    def admit(self, peer: str, samples: int, uid: str = "") -> None:
        """Count ``samples`` of ``peer`` (one request), or raise :class:`OverShare` and count nothing."""
        cap, request_cap = self.cap(peer, samples), self.request_cap(peer)
        mine, requests = self._by_peer.get(peer, 0) + samples, self._requests.get(peer, 0) + 1
        if cap is not None and mine > cap:
            raise OverShare(
                f"{uid}: {peer[:16]} would hold {mine} of the expert's last {self._total + samples} "
                f"updated samples; at most {self.config.share_multiple:g} x the median trainer's ({cap})"
            )
        if request_cap is not None and requests > request_cap:
            raise OverShare(
                f"{uid}: {peer[:16]} would have sent {requests} of the backwards in the expert's window; at "
                f"most {self.config.share_multiple:g} x the median trainer's ({request_cap})"
            )
        self._window.append((peer, samples))
        self._by_peer[peer] = mine
        self._requests[peer] = requests
        self._total += samples
        while self._total > self.config.share_window and len(self._window) > 1:
            old, n = self._window.popleft()
            self._total -= n
            self._by_peer[old] -= n
            self._requests[old] -= 1
            if self._requests[old] <= 0:
                del self._by_peer[old], self._requests[old]


class JumpDetector:
    """One expert's recent probe movements; :meth:`judge` says whether the newest one is a jump."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self._moves: deque[float] = deque(maxlen=config.jump_window)
        self._checks = 0

    @property
    def bound(self) -> float | None:
        """The movement above which a check is a jump; ``None`` while warming up."""
        if self._checks < self.config.jump_warmup or not self._moves:
            return None
        return self.config.jump_multiple * float(statistics.median(self._moves))

    def judge(self, movement: float) -> bool:
        """Record ``movement`` (at the bound if it is over it) and say whether it is a jump. A
        non-finite movement (the weights are NaN or inf) is always a jump."""
        bound = self.bound
        self._checks += 1
        if movement != movement or movement == float("inf"):
            return True
        jump = bound is not None and movement > bound
        self._moves.append(bound if jump and bound is not None else movement)
        return jump
