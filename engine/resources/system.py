"""The real machine's readings, assembled for the governor: idle time on every tick (cheap), the rest
(CPU load, battery, GPU, data used) on the slower ``full()`` read that the governor runs in a thread."""

from __future__ import annotations

from .bandwidth import DataCapCounter
from .idle import IdleReading, IdleSource, default_idle_source
from .sensors import GpuReading, NvmlGpu, OtherCpuLoad, Readings, read_battery


class SystemSensors:
    def __init__(
        self,
        idle_source: IdleSource | None = None,
        gpu: NvmlGpu | None = None,
        data_counter: DataCapCounter | None = None,
        use_gpu: bool = True,
        gpu_index: int = 0,
    ) -> None:
        self._idle = idle_source or default_idle_source()
        self._gpu = gpu if gpu is not None else (NvmlGpu(gpu_index) if use_gpu else None)
        self._cpu = OtherCpuLoad()
        self._data = data_counter

    def idle(self) -> IdleReading:
        return self._idle.read()

    def full(self) -> Readings:
        on_battery, percent = read_battery()
        gpu = self._gpu.read() if self._gpu is not None else GpuReading(reason="the GPU is turned off")
        data = self._data
        return Readings(
            other_cpu_percent=self._cpu.read(),
            on_battery=on_battery,
            battery_percent=percent,
            gpu=gpu,
            data_used_bytes=data.used() if data is not None else 0,
            data_period_end=data.period_end() if data is not None else None,
        )

    def close(self) -> None:
        self._idle.close()
        if self._gpu is not None:
            self._gpu.close()
