"""The governor against a real X server: Xvfb's MIT-SCREEN-SAVER idle counter, reset by XTest input."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.resources.decision import Reason, State
from engine.resources.governor import Governor
from engine.resources.idle import X11Idle
from engine.resources.settings import Settings
from engine.resources.system import SystemSensors

# No skip: scripts/services installs Xvfb and xdotool; without them this fails and says so.
assert shutil.which("Xvfb") and shutil.which("xdotool"), "needs Xvfb and xdotool (bash scripts/services)"


def _free_display() -> int:
    for n in range(91, 200):
        if not Path(f"/tmp/.X{n}-lock").exists() and not Path(f"/tmp/.X11-unix/X{n}").exists():
            return n
    raise RuntimeError("no free X display number in :91-:199")


@pytest.fixture
def xvfb() -> Iterator[str]:
    n = _free_display()
    proc = subprocess.Popen(
        ["Xvfb", f":{n}", "-screen", "0", "640x480x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/tmp/.X11-unix/X{n}").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Xvfb :{n} did not start")
            time.sleep(0.05)
        idle = X11Idle(f":{n}")
        while idle.read().seconds is None:  # socket exists before the server answers
            if time.monotonic() > deadline:
                raise RuntimeError(f"Xvfb :{n} does not answer: {idle.read().reason}")
            time.sleep(0.05)
        idle.close()
        yield f":{n}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


_moves = iter(range(10, 10_000, 7))


def move_mouse(display: str) -> None:
    x = next(_moves)
    subprocess.run(
        ["xdotool", "mousemove", str(x % 600), str(x % 400)],
        env={**os.environ, "DISPLAY": display},
        check=True,
        timeout=10,
    )


def test_idle_counts_up_and_input_resets_it(xvfb: str) -> None:
    idle = X11Idle(xvfb)
    try:
        move_mouse(xvfb)
        time.sleep(1.2)
        before = idle.read().seconds
        assert before is not None and before >= 1.0
        move_mouse(xvfb)
        after = idle.read().seconds
        assert after is not None and after < 0.5
    finally:
        idle.close()


def _governor(display: str) -> tuple[Governor, SystemSensors]:
    # idle_after_s below the settings file's minimum on purpose (built in code, not loaded), to keep it short.
    settings = Settings(use_gpu=False, idle_after_s=1, pause_when_other_cpu_percent=0)
    sensors = SystemSensors(idle_source=X11Idle(display), use_gpu=False)
    return Governor(settings, sensors), sensors


async def _next(q: asyncio.Queue, state: State, timeout: float) -> float:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        d = await asyncio.wait_for(q.get(), max(0.01, deadline - time.monotonic()))
        if d.state is state:
            return time.monotonic()


async def test_user_input_stops_work_within_a_second(xvfb: str) -> None:
    gov, sensors = _governor(xvfb)
    q = gov.subscribe()
    gov.start()
    latencies = []
    try:
        for _ in range(3):
            await _next(q, State.RUNNING, timeout=10)  # idle for 1 s -> running
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            await asyncio.to_thread(move_mouse, xvfb)
            t1 = await _next(q, State.WAITING, timeout=3)
            assert gov.decision is not None and gov.decision.reason_code is Reason.USER_ACTIVE
            assert "you're using the computer" in gov.decision.human_reason
            latencies.append(t1 - t0)
    finally:
        await gov.stop()
        sensors.close()
    print(f"yield latency after input: {[round(x * 1000) for x in latencies]} ms")
    assert max(latencies) < 1.0


async def test_governor_cpu_cost_while_running(xvfb: str) -> None:
    seconds = float(os.environ.get("LAH_GOVERNOR_COST_SECONDS", "5"))
    gov, sensors = _governor(xvfb)
    gov.start()
    try:
        await asyncio.sleep(1.5)  # into the running state (the fastest, 0.25 s polling)
        assert gov.decision is not None and gov.decision.state is State.RUNNING
        c0, t0, ticks0 = time.process_time(), time.monotonic(), gov.ticks
        await asyncio.sleep(seconds)
        cpu, wall, ticks = time.process_time() - c0, time.monotonic() - t0, gov.ticks - ticks0
    finally:
        await gov.stop()
        sensors.close()
    share = cpu / wall
    print(f"governor: {cpu * 1000:.1f} ms CPU over {wall:.1f} s, {ticks} ticks = {share:.3%} of a core")
    assert share < 0.01
