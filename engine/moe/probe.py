"""An expert's probe: its outputs on a few recent inputs, watched for jumps, and the state to go back to.

The rule (:mod:`.guard` states the numbers): the host keeps up to ``probe_rows`` rows of the inputs
that forwards brought, taken round-robin over the trainers that sent them (so that no one trainer
chooses the probe), and, once it has them, the expert's outputs on them plus a copy of its weights and
optimizer state (:func:`.checkpoint.snapshot_state`, the checkpoint format). Every ``probe_every``
optimizer steps it runs the probe again; the movement is the root mean square of the change of the
outputs. :class:`~.guard.JumpDetector` judges it: a jump restores the saved state (the expert loses
the steps since the last check, the poisoned one among them); anything else makes the current state
the last good one. Every ``REFRESH_CHECKS`` good checks the probe takes the newest rows, so that it
follows the inputs the expert sees now.

Costs, on the device's worker thread: one forward of ``probe_rows`` rows and one copy of the weights
and Adam state to the CPU every ``probe_every`` steps. :meth:`Probe.offer` runs on the event loop (one
row copied per forward) and :meth:`Probe.after_step` on the worker thread; a lock guards what both touch.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

import torch

from .checkpoint import Checkpoint, restore_state, snapshot_state
from .guard import GuardConfig, JumpDetector

__all__ = ["REFRESH_CHECKS", "Probe"]

logger = logging.getLogger(__name__)

#: Good checks between two refreshes of the probe's rows.
REFRESH_CHECKS = 16
#: Trainers whose rows are kept for the next refresh (the most recent ones).
MAX_SOURCES = 64


class Probe:
    """One expert's probe rows, their outputs at the last check and the state saved then."""

    def __init__(self, config: GuardConfig, uid: str = "") -> None:
        self.config = config
        self.uid = uid
        self.detector = JumpDetector(config)
        self._lock = threading.Lock()
        self._incoming: dict[str, deque[torch.Tensor]] = {}
        self.rows: torch.Tensor | None = None
        self.outputs: torch.Tensor | None = None
        self.good: Checkpoint | None = None
        self.steps = 0
        self.checks = 0
        self.rollbacks = 0
        self.last_movement: float | None = None

    def offer(self, peer: str, inputs: torch.Tensor) -> None:
        """Keep the first row of an accepted forward as a candidate for the probe (event loop)."""
        row = inputs[0].detach().to("cpu", torch.float32, copy=True)
        with self._lock:
            rows = self._incoming.pop(peer, None) or deque(maxlen=self.config.probe_rows)
            rows.append(row)
            self._incoming[peer] = rows  # re-inserted: the dict's order is the senders' recency
            while len(self._incoming) > MAX_SOURCES:
                del self._incoming[next(iter(self._incoming))]

    def _take_rows(self) -> torch.Tensor | None:
        """Up to ``probe_rows`` rows, one per trainer in turn (newest trainers first)."""
        with self._lock:
            queues = [list(q) for q in reversed(self._incoming.values())]
        picked: list[torch.Tensor] = []
        depth = 0
        while len(picked) < self.config.probe_rows and any(depth < len(q) for q in queues):
            picked += [q[-1 - depth] for q in queues if depth < len(q)]
            depth += 1
        if len(picked) < self.config.probe_rows:
            return None
        return torch.stack(picked[: self.config.probe_rows])

    def after_step(
        self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
    ) -> bool:
        """Call after each optimizer step (worker thread); ``True`` when it rolled the expert back."""
        self.steps += 1
        if self.steps % self.config.probe_every:
            return False
        if self.rows is None or self.outputs is None or self.good is None:
            self._reset(module, optimizer, device)
            return False
        now = _outputs(module, self.rows, device)
        movement = float((now - self.outputs).square().mean().sqrt())
        self.last_movement = movement
        self.checks += 1
        if self.detector.judge(movement):
            restore_state(module, optimizer, self.good)
            module.to(device)
            self.rollbacks += 1
            logger.warning(
                "%s: its outputs on the probe moved %.4g in %d steps (bound %s): rolled back to the state "
                "of %d steps ago",
                self.uid,
                movement,
                self.config.probe_every,
                self.detector.bound,
                self.config.probe_every,
            )
            return True
        if self.checks % REFRESH_CHECKS == 0:
            self._reset(module, optimizer, device)
        else:
            self.outputs = now
            self.good = snapshot_state(module, optimizer, {})
        return False

    def _reset(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        rows = self._take_rows()
        if rows is None:
            return
        self.rows = rows
        self.outputs = _outputs(module, rows, device)
        self.good = snapshot_state(module, optimizer, {})


def _outputs(module: torch.nn.Module, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = module(rows.to(device)).to("cpu", torch.float32)
    return out
