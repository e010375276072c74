"""The step's arithmetic, pure: which epoch a batch counts towards, and how far a step goes.

Epochs land within half a batch of the target (:func:`holds_back`): a batch that would overshoot the
target by more than leaving it out falls short goes to the next epoch. A step that averaged more (or
fewer) samples than the target moves the parameters in proportion (:func:`step_scale`, applied to the
learning rate for one step by :func:`scaled_learning_rate`), so training per sample matches training
with the target batch. :class:`~.optimizer.CollaborativeOptimizer` applies both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def step_scale(samples: int, target: int, low: float = 0.5, high: float = 2.0) -> float:
    """How much larger than planned this step is: the samples the step averaged over the target batch
    size, bounded. The learning rate is scaled by it (the linear scaling rule), so that an epoch that
    overshot the target by a few batches moves the parameters as far as the extra samples would have
    in a step of their own, and training per sample matches training with the target batch. Every
    member of a round scales by the same group total, so their steps stay identical."""
    if target <= 0 or samples <= 0:
        return 1.0
    return max(low, min(high, samples / target))


@contextlib.contextmanager
def scaled_learning_rate(optimizer: torch.optim.Optimizer, scale: float) -> Iterator[None]:
    """The optimizer's learning rates times ``scale`` for one step, restored after it (exactly: the
    original values are put back, not divided back)."""
    saved = [group.get("lr") for group in optimizer.param_groups]
    try:
        if scale != 1.0:
            for group, lr in zip(optimizer.param_groups, saved, strict=True):
                if isinstance(lr, float | int):
                    group["lr"] = lr * scale
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, saved, strict=True):
            if lr is not None:
                group["lr"] = lr


def holds_back(samples: float, batch: int, target: int) -> bool:
    """Whether a batch of ``batch`` samples goes to the next epoch rather than this one, when the
    collaboration has ``samples`` towards ``target`` without it: when adding it would overshoot the
    target by more than leaving it out falls short. So epochs land within half a batch of the target."""
    return samples > 0 and samples + batch / 2 > target
