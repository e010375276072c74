"""An estimate of the energy the volunteer's computer spent on contributed work.

GPU: where NVML reports board power (``nvmlDeviceGetPowerUsage``), the readings taken while the node was
working are integrated over time (trapezoids). That is the whole board's draw, idle floor included, so it
is an upper bound on what the work added; it is labelled "measured".

CPU: no portable power reading exists, so it is estimated. Assumption: a desktop CPU draws about its TDP
(default 65 W) with every logical core busy, shared equally between cores, so one second of one core's
busy time costs ``tdp_w / logical_cores`` joules. Our busy time is this process's user + system CPU time
while working. Real draw at partial load, turbo and idle states differ by tens of percent either way; the
figure is for "about how much", not for billing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_CPU_TDP_W = 65.0
JOULES_PER_KWH = 3.6e6


def cpu_energy_j(cpu_seconds: float, tdp_w: float = DEFAULT_CPU_TDP_W, logical_cores: int = 1) -> float:
    """Estimated joules for ``cpu_seconds`` of busy core time (see the module docstring)."""
    return max(0.0, cpu_seconds) * tdp_w / max(1, logical_cores)


def trapezoid_j(p0_w: float, p1_w: float, seconds: float) -> float:
    return max(0.0, seconds) * (p0_w + p1_w) / 2.0


def _process_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class EnergyTotals:
    gpu_j: float = 0.0  # measured (NVML board power)
    cpu_j: float = 0.0  # estimated (TDP share)

    @property
    def joules(self) -> float:
        return self.gpu_j + self.cpu_j

    @property
    def kwh(self) -> float:
        return self.joules / JOULES_PER_KWH


class EnergyMeter:
    """Call ``update`` every few seconds (the governor does, on each full reading)."""

    def __init__(
        self,
        cpu_tdp_w: float = DEFAULT_CPU_TDP_W,
        logical_cores: int | None = None,
        cpu_seconds: Callable[[], float] = _process_cpu_seconds,
    ) -> None:
        self.cpu_tdp_w = cpu_tdp_w
        self.cores = logical_cores or os.cpu_count() or 1
        self._cpu_seconds = cpu_seconds
        self.totals = EnergyTotals()
        self._last: tuple[float, bool, float | None, float] | None = None  # mono, working, power, cpu s

    def update(self, mono: float, working: bool, gpu_power_w: float | None) -> None:
        cpu = self._cpu_seconds()
        if self._last is not None:
            last_mono, was_working, last_power, last_cpu = self._last
            dt = mono - last_mono
            if was_working and dt > 0:
                if last_power is not None and gpu_power_w is not None:
                    self.totals.gpu_j += trapezoid_j(last_power, gpu_power_w, dt)
                self.totals.cpu_j += cpu_energy_j(cpu - last_cpu, self.cpu_tdp_w, self.cores)
        self._last = (mono, working, gpu_power_w, cpu)
