"""Spot checks: recompute a small random fraction of a host's forward answers from that host's own state.

A host that returns garbage (random numbers, zeros, stale or perturbed answers) would otherwise earn
credit for it. Replicas of an expert train apart (each applies the gradients it receives), so one
replica's answer says nothing about another's: a check judges a host only against itself. Every forward
reply states the expert's version (its update steps when it computed; -1 when a step ran meanwhile,
:mod:`engine.moe.server`). With probability ``fraction`` an answered forward request is checked: the
trainer fetches that host's state of the expert at once (``moe.state``: weights, update steps and their
sha256, checked against the spec by :func:`engine.moe.gather.fetch_state`), and if its update steps
still equal the stated version it recomputes the answer here from the exact wire inputs and compares.
Otherwise (the version is unknown, or the host took a step before the state was read) the check is
inconclusive: counted, never a flag.

A mismatch is a row of the answer whose relative distance ``|a - b| / max(|a|, |b|)`` exceeds
``tolerance`` (:data:`WIRE_TOLERANCE` for the replies' format: the same weights and inputs give the same
answer up to the reply's float16 rounding, about 5e-4, int8's blockwise quantization, at most 1.5% of a
row, or int4's, at most 24% of a row of an ffn expert), or a non-finite value; a row,
so a host that perturbs a few samples of a reply is caught as surely as one that perturbs all. The host
is reported (``POST /api/spot-checks``) with its version and digest in the reason.

Checks run as background tasks on the trainer's loop, at most ``max_in_flight`` at once; they never
delay a training step.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.moe.layer_calls import CallRecord
from engine.moe.registry import ExpertSpec, build
from engine.moe.weights import ExpertState
from engine.wire import all_finite

__all__ = ["WIRE_TOLERANCE", "SpotCheckStats", "SpotChecker", "mismatch", "recompute", "row_error"]

logger = logging.getLogger(__name__)

#: The largest row error an honest answer shows, by the replies' wire format, with a margin.
WIRE_TOLERANCE = {"float16": 0.05, "int8": 0.05, "int4": 0.5}

#: ``(host, uid) -> that host's current state of uid``, checked against the spec; raises on failure.
StateFetch = Callable[[str, str], Awaitable[ExpertState]]
#: ``uid -> the spec the trainer expects of it`` (None: not an expert this trainer can recompute).
SpecOf = Callable[[str], ExpertSpec | None]
#: ``(host, uid, period_start, period_end, reason)`` -> sends one report.
Reporter = Callable[[str, str, float, float, str], Awaitable[Any]]


def row_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest relative distance between matching rows of ``a`` and ``b`` (inf: they differ in
    shape or hold a non-finite value)."""
    if a.shape != b.shape:
        return float("inf")
    if not a.numel():
        return 0.0
    a, b = a.float().reshape(len(a), -1), b.float().reshape(len(b), -1)
    if not (all_finite(a) and all_finite(b)):
        return float("inf")
    scale = torch.maximum(a.norm(dim=1), b.norm(dim=1)).clamp(min=1e-6)
    return float(((a - b).norm(dim=1) / scale).max())


def mismatch(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    return row_error(a, b) > tolerance


def recompute(spec: ExpertSpec, state: ExpertState, inputs: torch.Tensor) -> torch.Tensor:
    """What the expert answers ``inputs`` with ``state``'s weights, computed here as a host computes
    (float32 on the wire inputs)."""
    module = build(spec)
    module.load_state_dict(dict(zip(state.names, state.tensors, strict=True)), strict=True)
    with torch.no_grad():
        out: torch.Tensor = module(inputs.to(torch.float32))
    return out


@dataclass
class SpotCheckStats:
    checked: int = 0  # recomputed and compared
    mismatches: int = 0
    reported: int = 0
    inconclusive: int = 0  # the version was unknown or had moved on before the state was read
    failed: int = 0  # the check itself could not be completed (the state could not be fetched, ...)
    skipped: int = 0  # chosen, but no spec to recompute with or too many checks in flight


class SpotChecker:
    def __init__(
        self,
        fetch_state: StateFetch,
        spec_of: SpecOf,
        report: Reporter,
        *,
        fraction: float = 0.02,
        tolerance: float = 0.05,
        max_in_flight: int = 2,
        rng: random.Random | None = None,
    ) -> None:
        self.fetch_state, self.spec_of, self.report = fetch_state, spec_of, report
        self.fraction, self.tolerance, self.max_in_flight = fraction, tolerance, max_in_flight
        self.rng = rng or random.Random()
        self.stats = SpotCheckStats()
        self._tasks: set[asyncio.Task[None]] = set()

    def consider(self, record: CallRecord) -> None:
        """Maybe check this answered forward request (on the event loop; never blocks, never raises).
        The state is asked for at once: the host's next update would make the check inconclusive."""
        if record.backward or not record.ok or record.inputs is None or record.outputs is None:
            return
        if self.rng.random() >= self.fraction:
            return
        if record.version < 0:
            self.stats.inconclusive += 1
            return
        spec = self.spec_of(record.uid)
        if spec is None or len(self._tasks) >= self.max_in_flight:
            self.stats.skipped += 1
            return
        task = asyncio.create_task(self._check(record, spec), name=f"spot-check-{record.uid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(self, record: CallRecord, spec: ExpertSpec) -> None:
        assert record.inputs is not None and record.outputs is not None
        try:
            state = await self.fetch_state(record.host, record.uid)
        except Exception as e:
            self.stats.failed += 1
            logger.info("spot check of %s on %s: no state (%s)", record.uid, record.host[:12], e)
            return
        if state.steps != record.version:
            self.stats.inconclusive += 1
            return
        try:
            expected = await asyncio.to_thread(recompute, spec, state, record.inputs)
        except (RuntimeError, ValueError) as e:  # a state that does not load into the spec's module
            self.stats.failed += 1
            logger.info("spot check of %s on %s: cannot recompute (%s)", record.uid, record.host[:12], e)
            return
        self.stats.checked += 1
        error = row_error(record.outputs, expected)
        if error <= self.tolerance:
            return
        self.stats.mismatches += 1
        reason = (
            f"output differs from its own state at version {state.steps} (sha256 {state.digest[:12]}): "
            f"row error {error:.3g} > {self.tolerance:g}"
        )
        now = time.time()
        try:
            await self.report(record.host, record.uid, min(record.served_at, now - 1), now, reason)
            self.stats.reported += 1
        except Exception as e:
            logger.warning("reporting a spot-check mismatch of %s failed: %s", record.host[:12], e)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
