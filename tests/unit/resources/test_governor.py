import asyncio
from datetime import datetime, timedelta

from engine.resources.decision import Decision, Reason, State
from engine.resources.energy import EnergyMeter, cpu_energy_j, trapezoid_j
from engine.resources.governor import Governor
from engine.resources.idle import IdleReading
from engine.resources.limits import cpu_pause_after
from engine.resources.sensors import GpuReading, Readings
from engine.resources.settings import Schedule, Settings

T0 = datetime(2025, 7, 16, 12, 0)  # Wednesday noon


class Clocks:
    def __init__(self) -> None:
        self.mono_t = 50.0
        self.wall_t = T0

    def mono(self) -> float:
        return self.mono_t

    def wall(self) -> datetime:
        return self.wall_t

    def advance(self, s: float) -> None:
        self.mono_t += s
        self.wall_t += timedelta(seconds=s)


class FakeSensors:
    def __init__(self) -> None:
        self.idle_s: float | None = 600.0
        self.full_reading = Readings(
            other_cpu_percent=1.0, gpu=GpuReading(name="g", temperature_c=50, power_w=100.0)
        )
        self.full_calls = 0

    def idle(self) -> IdleReading:
        return IdleReading(self.idle_s, "" if self.idle_s is not None else "headless")

    def full(self) -> Readings:
        self.full_calls += 1
        return self.full_reading


class Hooks:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_stop_work(self, decision: Decision) -> None:
        self.calls.append("stop:" + decision.reason_code)

    async def on_resume_work(self, decision: Decision) -> None:
        self.calls.append("resume")


DEFAULT = Settings()


def make(settings: Settings = DEFAULT) -> tuple[Governor, FakeSensors, Hooks, Clocks]:
    c, s, h = Clocks(), FakeSensors(), Hooks()
    return Governor(settings, s, h, wall=c.wall, mono=c.mono), s, h, c


async def test_hooks_and_events_on_changes_only() -> None:
    gov, sensors, hooks, clocks = make()
    seen: list[Decision] = []
    gov.add_listener(seen.append)
    q = gov.subscribe()
    assert (await gov.poll()).state is State.RUNNING
    await gov.poll()
    sensors.idle_s = 0.5
    assert (await gov.poll()).reason_code is Reason.USER_ACTIVE
    clocks.advance(1)
    sensors.idle_s = 1.5
    await gov.poll()  # same state: no new event, no hook
    sensors.idle_s = 200
    await gov.poll()
    assert hooks.calls == ["resume", "stop:user_active", "resume"]
    assert [d.reason_code for d in seen] == [Reason.RUNNING, Reason.USER_ACTIVE, Reason.RUNNING]
    assert [q.get_nowait().reason_code for _ in range(3)] == [
        Reason.RUNNING,
        Reason.USER_ACTIVE,
        Reason.RUNNING,
    ]
    assert q.empty()


async def test_first_decision_not_working_calls_stop() -> None:
    gov, sensors, hooks, _ = make()
    sensors.idle_s = None
    assert (await gov.poll()).reason_code is Reason.IDLE_UNKNOWN
    assert hooks.calls == ["stop:idle_unknown"]


async def test_pause_resume_snooze() -> None:
    gov, _, hooks, clocks = make()
    await gov.poll()
    gov.pause()
    assert (await gov.poll()).state is State.PAUSED
    gov.resume()
    assert (await gov.poll()).state is State.RUNNING
    gov.snooze(600)
    d = await gov.poll()
    assert d.state is State.SNOOZED and d.until == T0 + timedelta(seconds=600)
    assert gov.interval_for(d) == 5.0
    clocks.advance(598)
    assert abs(gov.interval_for(d) - 2.0) < 1e-6
    clocks.advance(2)
    assert (await gov.poll()).state is State.RUNNING
    assert hooks.calls == ["resume", "stop:paused", "resume", "stop:snoozed", "resume"]


async def test_clock_jump_backwards_and_forwards() -> None:
    # allowed 12:00-13:00 on Wednesdays only
    gov, sensors, _, clocks = make(
        Settings(schedule=Schedule(mon=(), tue=(), wed=("12:00-13:00",), thu=(), fri=(), sat=(), sun=()))
    )
    gov.snooze(300)
    assert (await gov.poll()).state is State.SNOOZED
    clocks.wall_t -= timedelta(hours=3)  # wall clock set back 3 h: the snooze still ends on monotonic time
    clocks.mono_t += 1
    calls = sensors.full_calls
    d = await gov.poll()
    await asyncio.sleep(0.05)  # the full read runs in a worker thread
    assert gov.clock_jumps == 1 and sensors.full_calls == calls + 1  # a jump forces a fresh full read
    assert d.state is State.SNOOZED and d.until == clocks.wall_t + timedelta(seconds=299)
    clocks.advance(300)
    d = await gov.poll()  # snooze over; wall says 09:05: outside the schedule, resumes at 12:00
    assert d.reason_code is Reason.OUTSIDE_SCHEDULE and d.until == datetime(2025, 7, 16, 12, 0)
    clocks.wall_t += timedelta(hours=3)  # and forwards again: inside the schedule at once
    clocks.mono_t += 1
    assert (await gov.poll()).state is State.RUNNING
    assert gov.clock_jumps == 2
    # normal time passing is not a jump
    clocks.advance(30)
    await gov.poll()
    assert gov.clock_jumps == 2


async def test_intervals_adapt() -> None:
    gov, sensors, _, _ = make()
    assert gov.interval_for(await gov.poll()) == 0.25
    sensors.idle_s = 1
    assert gov.interval_for(await gov.poll()) == 1.0
    sensors.idle_s = 600
    sensors.full_reading = Readings(on_battery=True)
    gov.set_settings(Settings())
    await gov.poll()  # full read started
    await asyncio.sleep(0.05)
    d = await gov.poll()
    assert d.reason_code is Reason.ON_BATTERY and gov.interval_for(d) == 2.0


async def test_run_loop_wakes_on_user_action() -> None:
    gov, _, _, _ = make()
    gov.parked_interval = 60
    gov.pause()
    task = gov.start()
    q = gov.subscribe()
    try:
        d = await asyncio.wait_for(q.get(), 2)
        assert d.state is State.PAUSED
        gov.resume()
        d = await asyncio.wait_for(q.get(), 2)  # well before the 60 s parked interval
        assert d.state is State.RUNNING
    finally:
        await gov.stop()
    assert task.done()


async def test_broken_hook_does_not_stop_governor() -> None:
    class Bad:
        async def on_stop_work(self, decision: Decision) -> None:
            raise RuntimeError("boom")

        async def on_resume_work(self, decision: Decision) -> None:
            raise RuntimeError("boom")

    c, s = Clocks(), FakeSensors()
    gov = Governor(Settings(), s, Bad(), wall=c.wall, mono=c.mono)
    assert (await gov.poll()).state is State.RUNNING


def test_energy_estimates() -> None:
    assert cpu_energy_j(10, 64, 8) == 80
    assert trapezoid_j(100, 200, 2) == 300
    cpu = [0.0]
    m = EnergyMeter(cpu_tdp_w=80, logical_cores=4, cpu_seconds=lambda: cpu[0])
    m.update(0, True, 100)
    cpu[0] = 4.0
    m.update(10, False, 120)  # worked during [0, 10]
    cpu[0] = 8.0
    m.update(20, False, 120)  # not working during [10, 20]: not counted
    assert m.totals.gpu_j == 1100 and m.totals.cpu_j == 80
    assert abs(m.totals.kwh - 1180 / 3.6e6) < 1e-12


def test_cpu_pause_after() -> None:
    s = Settings(cpu_threads=2, cpu_max_percent=25)
    assert cpu_pause_after(1.0, s, 4) == 1.0  # 2 threads on 4 cores = 50 %; half the time resting = 25 %
    assert cpu_pause_after(1.0, Settings(cpu_threads=1, cpu_max_percent=100), 4) == 0.0
