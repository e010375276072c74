"""Parameters and optimizer state averaged through the all-reduce, every ``average_state_every`` epochs.

Gradients alone keep identical members identical; members that drifted apart (a step taken alone, a
round that kept local values) are pulled together by averaging what they hold: the parameters and
every floating optimizer tensor of a parameter's shape (Adam's moments, not its step count), with
equal weights and uncompressed, through the same butterfly all-reduce as the gradients.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from engine.wire import Compression

from .allreduce import AllReduceService, RoundReport
from .group import Group

logger = logging.getLogger(__name__)


def averaged_tensors(params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Parameters, then each parameter's floating optimizer state of its shape (Adam's moments;
    not its step count), in an order every member derives alike."""
    tensors: list[torch.Tensor] = [p.data for p in params]
    for p in params:
        state = optimizer.state.get(p, {})
        for key in sorted(k for k in state if isinstance(k, str) and k != "step"):
            v = state[key]
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.shape == p.shape:
                tensors.append(v)
    return tensors


async def average_state(
    service: AllReduceService, group: Group, tensors: list[torch.Tensor]
) -> RoundReport | None:
    """Average ``tensors`` with ``group`` (equal weights, uncompressed): one flat copy of them for the
    round, written back in place."""
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    state_group = group.resized(flat.numel(), f"{group.round_id}/state", Compression.NONE)
    try:
        report = await service.all_reduce(state_group, flat, 1.0)
    except ValueError as e:
        logger.warning("round %s: state not averaged: %s", state_group.round_id, e)
        return None
    if not report.complete:
        logger.warning(
            "round %s: state averaging incomplete (%d elements local)",
            state_group.round_id,
            report.local_elements,
        )
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n
    return report
