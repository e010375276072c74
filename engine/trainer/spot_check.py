"""Spot checks: re-send a small random fraction of forward requests to another host and compare.

A host that returns garbage (random numbers, zeros, stale answers) would otherwise earn credit for it.
With probability ``fraction`` an answered forward request is re-sent, with the exact wire inputs, to a
second host of the same expert. Replicas of an expert train independently (each applies the gradients
it receives), so their answers differ a little; a mismatch is a relative distance
``|a - b| / max(|a|, |b|)`` above ``tolerance`` (0.5 by default: for the residual experts of the
registry an honest replica stays far closer, while noise or zeros land near or above 1), or any
non-finite value. On a mismatch a third host, when there is one, breaks the tie and the host that
disagrees with it is reported; with only two hosts the original host is reported (the coordinator
withholds its receipts for review, it does not punish). Reports go to ``POST /api/spot-checks``.

Checks run as background tasks on the trainer's loop, at most ``max_in_flight`` at once; they never
delay a training step.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.moe.layer_calls import CallRecord
from engine.wire import all_finite

__all__ = ["SpotCheckStats", "SpotChecker", "mismatch"]

logger = logging.getLogger(__name__)

#: ``(host, uid, wire inputs) -> outputs`` of one forward request to ``host``.
ForwardCall = Callable[[str, str, torch.Tensor], Awaitable[torch.Tensor]]
#: ``(host, uid, period_start, period_end, reason)`` -> sends one report.
Reporter = Callable[[str, str, float, float, str], Awaitable[Any]]


def mismatch(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    if a.shape != b.shape:
        return True
    a, b = a.float(), b.float()
    if not (all_finite(a) and all_finite(b)):
        return True
    scale = max(float(a.norm()), float(b.norm()), 1e-6)
    return float((a - b).norm()) / scale > tolerance


@dataclass
class SpotCheckStats:
    checked: int = 0
    mismatches: int = 0
    reported: int = 0
    failed: int = 0  # the check itself could not be completed (second host down, ...)
    skipped: int = 0  # chosen, but no second host or too many checks in flight


class SpotChecker:
    def __init__(
        self,
        hosts_of: Callable[[str], Sequence[str]],
        forward: ForwardCall,
        report: Reporter,
        *,
        fraction: float = 0.02,
        tolerance: float = 0.5,
        max_in_flight: int = 2,
        rng: random.Random | None = None,
    ) -> None:
        self.hosts_of, self.forward, self.report = hosts_of, forward, report
        self.fraction, self.tolerance, self.max_in_flight = fraction, tolerance, max_in_flight
        self.rng = rng or random.Random()
        self.stats = SpotCheckStats()
        self._tasks: set[asyncio.Task[None]] = set()

    def consider(self, record: CallRecord) -> None:
        """Maybe check this answered forward request (on the event loop; never blocks, never raises)."""
        if record.backward or not record.ok or record.inputs is None or record.outputs is None:
            return
        if self.rng.random() >= self.fraction:
            return
        others = [h for h in self.hosts_of(record.uid) if h != record.host]
        if not others or len(self._tasks) >= self.max_in_flight:
            self.stats.skipped += 1
            return
        task = asyncio.create_task(self._check(record, others), name=f"spot-check-{record.uid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(self, record: CallRecord, others: list[str]) -> None:
        assert record.inputs is not None and record.outputs is not None
        self.rng.shuffle(others)
        try:
            second = await self.forward(others[0], record.uid, record.inputs)
        except Exception as e:
            self.stats.failed += 1
            logger.info("spot check of %s on %s failed: %s", record.uid, others[0][:12], e)
            return
        self.stats.checked += 1
        if not mismatch(record.outputs, second, self.tolerance):
            return
        self.stats.mismatches += 1
        suspect, reason = record.host, f"output differs from host {others[0][:12]}'s"
        if len(others) > 1:
            try:
                third = await self.forward(others[1], record.uid, record.inputs)
            except Exception:
                third = None
            if third is not None and not mismatch(record.outputs, third, self.tolerance):
                suspect, reason = (
                    others[0],
                    f"output differs from hosts {record.host[:12]} and {others[1][:12]}",
                )
            elif third is not None:
                reason = f"output differs from hosts {others[0][:12]} and {others[1][:12]}"
        now = time.time()
        try:
            await self.report(suspect, record.uid, min(record.served_at, now - 1), now, reason)
            self.stats.reported += 1
        except Exception as e:
            logger.warning("reporting a spot-check mismatch of %s failed: %s", suspect[:12], e)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
