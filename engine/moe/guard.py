"""What a host holds against trainers that send poison: pure policy over numbers, no torch, no sockets.

An expert learns from whatever gradients trainers send it, and any admitted peer may send them. Three
bounds keep one trainer (or a minority of them) from steering an expert every other trainer uses
(issue 28, item 3); :class:`~.backend.ExpertBackend` applies them, :mod:`.probe` measures the outputs.

**Gradient norm** (:class:`NormBound`). A backward's size is the root mean square over its rows of the
output gradient's row norms (``||g||_F / sqrt(rows)``: independent of the request's batch size). The
recent statistic is robust twice: each trainer's median over the last ``norm_window`` recorded requests
of the expert, then the median of those over trainers, so that a minority of trainers cannot move it
however many requests they send. After ``norm_warmup`` recorded requests from at least two trainers, a
backward above ``norm_multiple`` x that statistic is **refused** (:class:`~.errors.GradientTooLarge`),
not clipped: a clipped request would still cast a full-size vote in whatever direction it chose, and
an honest gradient ``norm_multiple`` times its peers' is rare enough that losing it costs little (the
trainer skips the expert for that step, as for any refusal). A refused request is recorded at the
bound, not at its size: a minority's refusals leave the median where the honest trainers keep it,
while a change of scale shared by most trainers (the loss jumps for everyone) raises it by at most
``norm_multiple`` per window, so the bound follows a real change instead of refusing everyone forever.
The host's existing clip of each step's summed gradient (``max_grad_norm``) still applies after this.

**Share of updates** (:class:`ShareWindow`). Over the last ``share_window`` samples of an expert's
accepted backwards, no trainer (peer id) may contribute more than ``max(max_share, share_per_active /
n)`` of the samples, ``n`` the trainers in the window counting the sender: twice a fair share, or
``max_share`` when many are active. A request that would take its sender over is **refused**
(:class:`~.errors.OverShare`); with no other trainer in the window there is no one to protect and no
bound. Refused, not down-weighted: the host does no work for it, and the sender learns why by its
code. A coalition of ``b`` trainers still holds up to ``b`` caps: this bounds each, not all.

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
    norm_window: int = 256
    norm_warmup: int = 32
    max_share: float = 0.25
    share_per_active: float = 2.0
    share_window: int = 2048
    probe_rows: int = 32
    probe_every: int = 8
    jump_multiple: float = 6.0
    jump_window: int = 32
    jump_warmup: int = 8

    def __post_init__(self) -> None:
        if not (self.norm_multiple > 1 and self.jump_multiple > 1):
            raise ValueError("norm_multiple and jump_multiple must exceed 1")
        if not 0 < self.max_share <= 1 or self.share_per_active <= 0:
            raise ValueError("max_share must be in (0, 1] and share_per_active positive")
        if min(self.norm_window, self.share_window, self.probe_rows, self.probe_every, self.jump_window) < 1:
            raise ValueError("windows, probe rows and probe_every must be at least 1")
        if self.norm_warmup < 0 or self.jump_warmup < 1:
            raise ValueError("norm_warmup must be >= 0 and jump_warmup >= 1")


def row_rms(squared_norm: float, rows: int) -> float:
    """A request's size: ``sqrt(||g||_F^2 / rows)``, the root mean square of its rows' norms."""
    return math.sqrt(max(squared_norm, 0.0) / max(rows, 1))


def _median_of_medians(entries: Iterable[tuple[str, float]]) -> float:
    per_peer: dict[str, list[float]] = {}
    for peer, value in entries:
        per_peer.setdefault(peer, []).append(value)
    return float(statistics.median(statistics.median(v) for v in per_peer.values()))


class NormBound:
    """One expert's bound on a backward's output-gradient size (the module docstring's rule)."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self._recorded: deque[tuple[str, float]] = deque(maxlen=config.norm_window)
        self._count = 0
        self._bound: float | None = None
        self._stale = True

    @property
    def bound(self) -> float | None:
        """The size above which a backward is refused now; ``None`` while warming up."""
        if self._stale:
            self._stale = False
            peers = {p for p, _ in self._recorded}
            if self._count < self.config.norm_warmup or len(peers) < 2:
                self._bound = None
            else:
                self._bound = self.config.norm_multiple * _median_of_medians(self._recorded)
        return self._bound

    def admit(self, peer: str, size: float, uid: str = "") -> None:
        """Record ``size`` for ``peer``, or record the bound and raise :class:`GradientTooLarge`."""
        bound = self.bound
        if not size >= 0.0:  # NaN: the finiteness check refuses those first; here, never recorded
            raise GradientTooLarge(f"{uid}: gradient size {size} from {peer[:16]} is not a number")
        refused = bound is not None and size > bound
        self._recorded.append((peer, bound if refused and bound is not None else size))
        self._count += 1
        self._stale = True
        if refused:
            raise GradientTooLarge(
                f"{uid}: output gradient of size {size:.4g} per row from {peer[:16]} is over "
                f"{self.config.norm_multiple:g} x the expert's recent median ({bound:.4g})"
            )


class ShareWindow:
    """One expert's last ``share_window`` accepted samples by trainer (the module docstring's rule)."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self._window: deque[tuple[str, int]] = deque()
        self._by_peer: dict[str, int] = {}
        self._total = 0

    def share(self, peer: str) -> float:
        return self._by_peer.get(peer, 0) / self._total if self._total else 0.0

    def cap(self, peer: str) -> float:
        """The share ``peer`` may hold: ``max(max_share, share_per_active / n)``, n counting ``peer``."""
        active = len(self._by_peer) + (peer not in self._by_peer)
        return max(self.config.max_share, self.config.share_per_active / active)

    def admit(self, peer: str, samples: int, uid: str = "") -> None:
        """Count ``samples`` of ``peer``, or raise :class:`OverShare` and count nothing."""
        others = len(self._by_peer) - (peer in self._by_peer)
        if others > 0:
            mine = self._by_peer.get(peer, 0) + samples
            share, cap = mine / (self._total + samples), self.cap(peer)
            if share > cap:
                raise OverShare(
                    f"{uid}: {peer[:16]} would hold {share:.2f} of the expert's last {self._total} "
                    f"updated samples; at most {cap:.2f} while {others} other trainer(s) are active"
                )
        self._window.append((peer, samples))
        self._by_peer[peer] = self._by_peer.get(peer, 0) + samples
        self._total += samples
        while self._total > self.config.share_window and len(self._window) > 1:
            old, n = self._window.popleft()
            self._total -= n
            self._by_peer[old] -= n
            if self._by_peer[old] <= 0:
                del self._by_peer[old]


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
