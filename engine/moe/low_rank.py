"""A low-rank bottleneck at the expert boundary: r numbers a token cross the wire instead of d.

A mixture's expert calls carry every chosen token's row to the host and back, in both passes, so the
wire's bytes grow with the model width d while the expert's compute grows with d times its hidden width
and depth. Subspace compression (Pluralis; issue 33 item 2) cuts the bytes by projecting at the
boundary: the trainer sends ``down(x)`` (d -> r), the expert lifts it back (r -> d), computes at full
width, and projects its answer down again (d -> r); the trainer lifts the mixture's combined answer
(r -> d) and adds it to the residual stream. Each projection is learned with the rest.

- :class:`LowRankExpert` (host side): ``down_e(inner(up_e(z)))`` for any registered architecture
  ``inner`` of width d; an :class:`~engine.moe.registry.ExpertSpec` with ``wire_rank = r`` builds one,
  and its input shape (what a host checks a request against) ends in r.
- :class:`LowRankBoundary` (trainer side): ``x + up(mixture(down(x)))`` around any mixture over
  ``[tokens, r]`` (remote or local); gating sees the projected rows, so the mixture needs nothing new.

The residual stays on the trainer: a token's full-width state never crosses the wire.

Imports torch alone: registry.py builds on it.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LowRankBoundary", "LowRankExpert"]


class LowRankExpert(nn.Module):
    """``inner`` (width ``dim``) behind a learned lift ``rank -> dim`` and a projection ``dim -> rank``."""

    def __init__(self, inner: nn.Module, dim: int, rank: int) -> None:
        super().__init__()
        self.lift = nn.Linear(rank, dim)
        self.inner = inner
        self.project = nn.Linear(dim, rank)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.project(self.inner(self.lift(z)))
        return out


class LowRankBoundary(nn.Module):
    """The trainer's side: ``x + up(mixture(down(x)))``; ``mixture`` maps ``[tokens, rank]`` to itself."""

    def __init__(self, mixture: nn.Module, dim: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(dim, rank)
        self.mixture = mixture
        self.up = nn.Linear(rank, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.up(self.mixture(self.down(x)))
        return out
