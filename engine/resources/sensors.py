"""Cheap readings of the machine for the governor: other programs' CPU and GPU load, battery, GPU
temperature, memory and power. Each reader returns ``None`` plus a plain reason when it cannot tell, and
never raises for an absent device or one that vanishes mid-run (NVML errors become readings with a reason).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psutil  # type: ignore[import-untyped]


@dataclass(frozen=True, slots=True)
class GpuReading:
    name: str | None = None  # None: no GPU to use (``reason`` says why)
    reason: str = ""
    utilization_percent: float | None = None  # the whole device
    other_utilization_percent: float | None = None  # by processes other than ours
    temperature_c: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None

    @property
    def present(self) -> bool:
        return self.name is not None


NO_GPU_READ = GpuReading(reason="the GPU has not been read yet")


@dataclass(frozen=True, slots=True)
class Readings:
    """Everything ``decide`` looks at. ``None`` always means "unknown"; ``*_reason`` says why."""

    idle_s: float | None = None
    idle_reason: str = ""
    other_cpu_percent: float | None = None  # share of the whole machine, 0-100
    on_battery: bool | None = None  # None: no battery or unknown (treated as on mains power)
    battery_percent: float | None = None
    gpu: GpuReading = field(default=NO_GPU_READ)
    data_used_bytes: int = 0  # this data-cap period, both directions
    data_period_end: datetime | None = None


class OtherCpuLoad:
    """Whole-machine CPU busy share minus our own process's, since the previous call (non-blocking)."""

    def __init__(self, process: psutil.Process | None = None, cpu_count: int | None = None) -> None:
        self._proc = process or psutil.Process()
        self._cores = cpu_count or psutil.cpu_count() or 1
        psutil.cpu_percent(None)  # prime both counters; the first real read covers the time since now
        self._proc.cpu_percent(None)

    def read(self) -> float | None:
        try:
            total = float(psutil.cpu_percent(None))
            ours = float(self._proc.cpu_percent(None)) / self._cores
        except (psutil.Error, OSError):
            return None
        return max(0.0, min(100.0, total - ours))


def read_battery() -> tuple[bool | None, float | None]:
    """(on battery?, percent); (None, None) where there is no battery or psutil cannot tell."""
    try:
        b = psutil.sensors_battery() if hasattr(psutil, "sensors_battery") else None
    except (psutil.Error, OSError, RuntimeError):
        return None, None
    if b is None:
        return None, None
    plugged = b.power_plugged
    return (None if plugged is None else not plugged), float(b.percent)


class NvmlGpu:
    """One NVIDIA GPU through nvidia-ml-py. No driver or no such GPU -> ``GpuReading(name=None, reason)``.

    After an error (driver unloaded, GPU fell off the bus) the reader shuts NVML down and tries again at
    most every ``retry_s`` seconds; until then it answers "no GPU" with the error as the reason.
    """

    def __init__(
        self,
        index: int = 0,
        nvml: Any = None,
        retry_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if nvml is None:
            import pynvml  # type: ignore[import-untyped]

            nvml = pynvml
        self._nvml: Any = nvml
        self._index = index
        self._retry_s = retry_s
        self._clock = clock
        self._handle: Any = None
        self._name = ""
        self._reason = ""
        self._next_try = float("-inf")
        self._last_sample_ts = 0

    def _open(self) -> None:
        nv = self._nvml
        nv.nvmlInit()
        count = nv.nvmlDeviceGetCount()
        if self._index >= count:
            nv.nvmlShutdown()
            raise LookupError(f"GPU {self._index} does not exist (this computer has {count})")
        self._handle = nv.nvmlDeviceGetHandleByIndex(self._index)
        name = nv.nvmlDeviceGetName(self._handle)
        self._name = name.decode() if isinstance(name, bytes) else str(name)

    def _fail(self, reason: str) -> GpuReading:
        self.close()
        self._reason = reason
        self._next_try = self._clock() + self._retry_s
        return GpuReading(reason=reason)

    def read(self) -> GpuReading:
        nv = self._nvml
        if self._handle is None:
            if self._clock() < self._next_try:
                return GpuReading(reason=self._reason)
            try:
                self._open()
            except LookupError as e:
                return self._fail(str(e))
            except nv.NVMLError as e:
                return self._fail(f"no NVIDIA GPU available ({e})")
        h = self._handle
        try:
            util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            temp = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            mem = nv.nvmlDeviceGetMemoryInfo(h)
        except nv.NVMLError as e:
            return self._fail(f"the GPU stopped answering ({e})")
        return GpuReading(
            name=self._name,
            utilization_percent=util,
            other_utilization_percent=self._other_utilization(h, util),
            temperature_c=temp,
            memory_used_bytes=int(mem.used),
            memory_total_bytes=int(mem.total),
            power_w=self._power(h),
        )

    def _power(self, h: Any) -> float | None:
        try:
            return float(self._nvml.nvmlDeviceGetPowerUsage(h)) / 1000.0  # milliwatts
        except self._nvml.NVMLError:
            return None  # many consumer GPUs do not report power

    def _other_utilization(self, h: Any, total: float) -> float | None:
        """Device utilisation minus our own process's share (per-process samples), where NVML can tell."""
        nv, me = self._nvml, os.getpid()
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, self._last_sample_ts)
        except nv.NVMLError:
            samples = None
        if samples is not None:
            if samples:
                self._last_sample_ts = max(int(s.timeStamp) for s in samples)
            ours = sum(float(s.smUtil) for s in samples if int(s.pid) == me)
            return max(0.0, total - ours)
        try:
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(h))
        except nv.NVMLError:
            return None
        return total if all(int(p.pid) != me for p in procs) else None

    def close(self) -> None:
        if self._handle is not None:
            self._handle = None
            with contextlib.suppress(Exception):  # NVML may already be gone; nothing to release
                self._nvml.nvmlShutdown()
