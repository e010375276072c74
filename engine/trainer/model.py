"""The demo model: handwritten digits (8x8 → 64 features, 10 classes) through a DMoE layer.

``dense input → mixture of experts → classifier head``. The mixture is a
:class:`~engine.moe.RemoteMixtureOfExperts` over the experiment's grid, or, for comparison, a
:class:`LocalMixtureOfExperts` with the same gating whose experts live in this process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.moe.local import LocalMixtureOfExperts

__all__ = ["Digits", "DigitsDMoE", "LocalMixtureOfExperts", "load_digits_split"]


@dataclass(frozen=True)
class Digits:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_digits_split(test_fraction: float = 0.2, seed: int = 0) -> Digits:
    """sklearn's bundled digits (no download), pixels scaled to [0, 1], a fixed-seed stratified split."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]
    from sklearn.model_selection import train_test_split  # type: ignore[import-untyped]

    data = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(
        data.data / 16.0, data.target, test_size=test_fraction, random_state=seed, stratify=data.target
    )
    f, i = torch.float32, torch.long
    return Digits(
        torch.tensor(x_tr, dtype=f),
        torch.tensor(y_tr, dtype=i),
        torch.tensor(x_te, dtype=f),
        torch.tensor(y_te, dtype=i),
    )


class DigitsDMoE(nn.Module):
    """``Linear(64, dim) → GELU → mixture (dim → dim) → LayerNorm → Linear(dim, 10)``."""

    def __init__(self, mixture: nn.Module, dim: int, in_features: int = 64, n_classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(in_features, dim), nn.GELU())
        self.moe = mixture
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.moe(self.inp(x)))
        return out
