"""MixtureLayer: the swarm's mixture as an ordinary ``nn.Module`` in a researcher's own model.

It wraps a :class:`~engine.moe.RemoteMixtureOfExperts` on the trainer's Peer, finder and observer (so
every call leaves a receipt, may be spot-checked, and tells the finder which hosts answer), and checks
what it is given before anything leaves the process: features of the grid's width, floating point. Any
leading shape is accepted and flattened, so ``[batch, time, dim]`` works as ``[batch * time, dim]``
(each token routed on its own) and the output has the input's shape. Its parameters are the gates,
part of the dense model the researcher's optimizer trains; the experts train on their hosts from the
gradients the backward pass sends them.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.moe import RemoteMixtureOfExperts

from .errors import Mismatch
from .experiment import Grid

__all__ = ["MixtureLayer"]


class MixtureLayer(nn.Module):
    """``[..., dim] -> [..., dim]`` through the grid's experts (residual: experts return ``x + FFN(x)``)."""

    def __init__(self, grid: Grid, mixture: RemoteMixtureOfExperts) -> None:
        super().__init__()
        self.grid = grid
        self.mixture = mixture

    @property
    def dim(self) -> int:
        return self.grid.dim

    @property
    def short_rows(self) -> int:
        """Tokens passed through unchanged for want of answers (``pass_short`` layers)."""
        return self.mixture.short_rows

    def check(self, x: torch.Tensor) -> None:
        """:class:`Mismatch` for an input the experts cannot take (nothing has been sent yet)."""
        if not isinstance(x, torch.Tensor):
            raise Mismatch(f"grid {self.grid.name}'s layer takes a tensor, not {type(x).__name__}")
        if x.ndim < 2 or x.shape[-1] != self.grid.dim:
            raise Mismatch(
                f"grid {self.grid.name}'s experts take {self.grid.dim} features per token; this input is "
                f"{list(x.shape)}: give the layer [tokens, {self.grid.dim}] (or [..., {self.grid.dim}])"
            )
        dtype = self.mixture.gates[0].weight.dtype
        if x.dtype != dtype:
            raise Mismatch(
                f"grid {self.grid.name}'s layer takes {dtype} features, not {x.dtype}: convert them"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check(x)
        flat = x.reshape(-1, self.grid.dim)
        out: torch.Tensor = self.mixture(flat)
        return out.reshape(x.shape)

    def extra_repr(self) -> str:
        shape = "x".join(map(str, self.grid.shape))
        return f"grid={self.grid.name!r}, experts={shape}, dim={self.grid.dim}, k_best={self.grid.k_best}"
