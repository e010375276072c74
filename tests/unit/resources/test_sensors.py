import os
from types import SimpleNamespace
from typing import Any

import pytest

from engine.resources.idle import UnknownIdle, X11Idle, default_idle_source
from engine.resources.sensors import NvmlGpu, OtherCpuLoad, read_battery


class NVMLError(Exception):
    pass


class FakeNvml:
    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        self.alive = True
        self.inits = 0
        self.samples: Any = []

    def _check(self) -> None:
        if not self.alive:
            raise NVMLError("GPU is lost")

    def nvmlInit(self) -> None:
        self._check()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> object:
        return object()

    def nvmlDeviceGetName(self, h: object) -> bytes:
        return b"Fake RTX"

    def nvmlDeviceGetUtilizationRates(self, h: object) -> Any:
        self._check()
        return SimpleNamespace(gpu=70)

    def nvmlDeviceGetTemperature(self, h: object, kind: int) -> int:
        self._check()
        return 65

    def nvmlDeviceGetMemoryInfo(self, h: object) -> Any:
        return SimpleNamespace(used=1 << 30, total=8 << 30)

    def nvmlDeviceGetPowerUsage(self, h: object) -> int:
        return 150_000

    def nvmlDeviceGetProcessUtilization(self, h: object, ts: int) -> Any:
        if self.samples is None:
            raise NVMLError("not supported")
        return self.samples

    def nvmlDeviceGetComputeRunningProcesses(self, h: object) -> Any:
        return [SimpleNamespace(pid=os.getpid())]


def test_real_nvml_absent_is_no_gpu() -> None:
    r = NvmlGpu().read()
    assert not r.present and "no NVIDIA GPU" in r.reason


def test_fake_gpu_readings_and_other_utilization() -> None:
    nv = FakeNvml()
    nv.samples = [
        SimpleNamespace(pid=os.getpid(), smUtil=50, timeStamp=5),
        SimpleNamespace(pid=1, smUtil=20, timeStamp=6),
    ]
    r = NvmlGpu(nvml=nv).read()
    assert r.present and r.name == "Fake RTX" and r.temperature_c == 65 and r.power_w == 150
    assert r.other_utilization_percent == 20
    nv.samples = None  # no per-process samples, and we are on the GPU: cannot tell
    assert NvmlGpu(nvml=nv).read().other_utilization_percent is None


def test_gpu_disappears_mid_run_and_comes_back() -> None:
    nv, t = FakeNvml(), [0.0]
    gpu = NvmlGpu(nvml=nv, retry_s=60, clock=lambda: t[0])
    assert gpu.read().present
    nv.alive = False
    r = gpu.read()
    assert not r.present and "stopped answering" in r.reason
    nv.alive = True
    t[0] = 30
    assert not gpu.read().present  # waits before retrying
    t[0] = 61
    assert gpu.read().present and nv.inits == 2


def test_missing_gpu_index() -> None:
    r = NvmlGpu(index=3, nvml=FakeNvml()).read()
    assert not r.present and "GPU 3 does not exist" in r.reason


def test_cpu_and_battery_here() -> None:
    load = OtherCpuLoad().read()
    assert load is None or 0 <= load <= 100
    assert read_battery() == (None, None)  # this machine has no battery


@pytest.mark.parametrize(
    ("env", "platform", "kind", "reason"),
    [
        ({}, "linux", UnknownIdle, "no display"),
        ({"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}, "linux", UnknownIdle, "Wayland"),
        ({"DISPLAY": ":0"}, "linux", X11Idle, None),
    ],
)
def test_default_idle_source(env: dict[str, str], platform: str, kind: type, reason: str | None) -> None:
    src = default_idle_source(env, platform)
    assert isinstance(src, kind)
    if reason:
        r = src.read()
        assert r.seconds is None and reason in r.reason


def test_x11_without_server_is_unknown() -> None:
    r = X11Idle(":1999").read()
    assert r.seconds is None and "X11" in r.reason
