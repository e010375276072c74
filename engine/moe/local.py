"""LocalMixtureOfExperts: the remote layer's gating and top-k softmax, every expert in this process.

The baseline a swarm is measured against (same architecture, seed and batches, no network), and a
layer a researcher can train or test with before there are volunteers. Grid gating as in
:mod:`.mixture`: an expert's score is the sum of its coordinates' gate scores; the softmax runs over the
``k_best`` best experts of each sample (here every expert answers, so nothing is renormalised away).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn

from .registry import ExpertSpec, build

__all__ = ["LocalMixtureOfExperts"]


class LocalMixtureOfExperts(nn.Module):
    """A mixture over ``[batch, dim]`` inputs with its experts as submodules (cell order: row-major)."""

    def __init__(self, in_features: int, grid_size: Sequence[int], spec: ExpertSpec, k_best: int = 4) -> None:
        super().__init__()
        self.grid_size = tuple(grid_size)
        self.k_best = k_best
        self.gates = nn.ModuleList(nn.Linear(in_features, n) for n in self.grid_size)
        self.cells = list(itertools.product(*(range(n) for n in self.grid_size)))
        self.experts = nn.ModuleList(build(spec) for _ in self.cells)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = x.new_zeros((x.shape[0], *self.grid_size))
        for d, gate in enumerate(self.gates):
            shape = [x.shape[0]] + [n if i == d else 1 for i, n in enumerate(self.grid_size)]
            total = total + gate(x).view(shape)
        scores, index = total.flatten(1).topk(min(self.k_best, len(self.cells)), dim=1)
        weights = torch.softmax(scores, dim=1)
        out = torch.zeros_like(x)
        for e in torch.unique(index).tolist():
            rows, slots = (index == e).nonzero(as_tuple=True)
            out = out.index_add(0, rows, weights[rows, slots].unsqueeze(-1) * self.experts[e](x[rows]))
        return out
