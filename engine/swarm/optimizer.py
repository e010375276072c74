"""The dense part's optimizer, stepping with the experiment's other trainers (DeDLOC, engine.collab).

``Swarm.optimizer`` builds the researcher's own torch optimizer over the parameters they name; with
a target batch size set by the experiment it wraps it in a :class:`~engine.collab.CollaborativeOptimizer`
on the trainer's Peer and DHT, and :class:`SwarmOptimizer` is its synchronous face for an ordinary
training loop: ``zero_grad()``, ``loss.backward()``, ``step()``. Each ``step`` hands this batch's
gradients to the collaboration (blocking while a round averages them, bounded by the trainer's
``collab_timeout_s``); the optimizer steps when together the trainers reached the target. A step that
fails (a peer gone mid-round, the DHT away) is logged and the next batch tries again, as ``lah train``
does: the gradients stay accumulated.

Trainers collaborate only with trainers of the same dense model: the run is named after the
experiment and a digest of the parameters' shapes and the optimizer's class (:func:`run_name`), so a
researcher's own model never averages with ``lah train``'s or another researcher's different one.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from engine.collab import CollabError, CollaborativeOptimizer, StepReport
from engine.dht import DHTError
from engine.moe import LoopThread

from .errors import Mismatch

__all__ = ["SwarmOptimizer", "dense_module", "run_name"]

logger = logging.getLogger(__name__)


def dense_module(params: Iterable[Any]) -> nn.ParameterList:
    """The parameters as one module (what the collaboration names, averages and shares), the same
    tensors, not copies; :class:`Mismatch` for anything that is not a parameter, or none at all."""
    items = list(params)
    if items and isinstance(items[0], dict):
        raise Mismatch("give the optimizer the parameters themselves (model.parameters()), not groups")
    if not items:
        raise Mismatch("the optimizer was given no parameters: pass model.parameters()")
    seen: set[int] = set()
    unique = []
    for p in items:
        if not isinstance(p, nn.Parameter):
            raise Mismatch(f"the optimizer's parameters must be nn.Parameter, not {type(p).__name__}")
        if id(p) not in seen:
            seen.add(id(p))
            unique.append(p)
    return nn.ParameterList(unique)


def run_name(experiment: str, dense: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """``<experiment>.own.<digest>``: one collaboration per model shape and optimizer class."""
    h = hashlib.sha256(type(optimizer).__qualname__.encode())
    for p in dense.parameters():
        h.update(f"|{tuple(p.shape)}:{p.dtype}".encode())
    return f"{experiment}.own.{h.hexdigest()[:16]}"


class SwarmOptimizer:
    """A torch optimizer whose steps the experiment's trainers take together (module docstring)."""

    def __init__(
        self, collab: CollaborativeOptimizer, loop: LoopThread, *, samples: int, timeout_s: float
    ) -> None:
        self.collab, self.loop = collab, loop
        self.samples, self.timeout_s = samples, timeout_s
        self.steps: list[tuple[int, int]] = []  # (epoch, group size) of each step this trainer took
        self.failed = 0  # steps that failed (logged; the next batch tries again)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The researcher's own optimizer (for a learning-rate scheduler, its state)."""
        return self.collab.optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.collab.optimizer.param_groups

    @property
    def epoch(self) -> int:
        """The collaboration's optimizer steps so far (taken here, or caught up from the others)."""
        return self.collab.epoch

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.collab.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, samples: int | None = None) -> StepReport | None:
        """After ``loss.backward()``: this batch's gradients, of ``samples`` samples (default: the
        batch size given to ``Swarm.optimizer``), go to the collaboration; a report when it stepped."""
        n = self.samples if samples is None else samples
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise Mismatch(f"step(samples=...) counts this batch's samples: a positive int, not {n!r}")
        try:
            report = self.loop.run(self.collab.step(n), self.timeout_s)
        except (CollabError, DHTError, TimeoutError) as e:
            self.failed += 1
            logger.warning("collaborative step failed (the next batch tries again): %s", e)
            return None
        if report is not None and report.samples > 0:
            self.steps.append((report.epoch, report.group_size))
        return report

    def state_dict(self) -> dict[str, Any]:
        return self.collab.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.collab.optimizer.load_state_dict(state)
