from datetime import datetime, timedelta

import pytest

from engine.resources.decision import Decision, Now, Reason, State, UserState, decide, format_duration
from engine.resources.sensors import GpuReading, Readings
from engine.resources.settings import Schedule, Settings

WED_NOON = datetime(2025, 7, 16, 12, 0)  # a Wednesday
NOW = Now(WED_NOON, 1000.0)
GPU = GpuReading(name="Fake GPU", temperature_c=60.0, other_utilization_percent=0.0)
IDLE = Readings(idle_s=600.0, other_cpu_percent=5.0, on_battery=False, gpu=GPU)
NO_SCHEDULE_WED = Schedule(wed=())


DEFAULT = Settings()
AWAY = UserState()


def R(**changes: object) -> Readings:
    """IDLE with some fields changed."""
    return Readings(**{**_fields(IDLE), **changes})  # type: ignore[arg-type]


def run(settings: Settings = DEFAULT, readings: Readings = IDLE, user: UserState = AWAY, **kw):  # type: ignore[no-untyped-def]
    return decide(settings, readings, kw.pop("now", NOW), user, kw.pop("previous", None))


def everything_wrong() -> tuple[Settings, Readings, UserState]:
    settings = Settings(schedule=NO_SCHEDULE_WED, monthly_data_cap_mib=1)
    readings = Readings(
        idle_s=1.0,
        other_cpu_percent=99.0,
        on_battery=True,
        gpu=GpuReading(name="g", temperature_c=99.0, other_utilization_percent=99.0),
        data_used_bytes=2**21,
        data_period_end=datetime(2025, 8, 1),
    )
    return settings, readings, UserState(paused=True, snooze_until_mono=2000.0)


def test_running_when_idle() -> None:
    d = run()
    assert (d.state, d.reason_code) == (State.RUNNING, Reason.RUNNING)
    assert d.working and "graphics card" in d.human_reason


def _fields(r: Readings) -> dict[str, object]:
    return {f: getattr(r, f) for f in r.__slots__}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("settings", "readings", "user", "state", "reason", "text"),
    [
        (Settings(), IDLE, UserState(paused=True), State.PAUSED, Reason.PAUSED, "Paused by you"),
        (Settings(), IDLE, UserState(snooze_until_mono=4600.0), State.SNOOZED, Reason.SNOOZED, "13:00"),
        (Settings(schedule=NO_SCHEDULE_WED), IDLE, AWAY, State.WAITING, Reason.OUTSIDE_SCHEDULE, "tomorrow"),
        (Settings(run_on_battery=False), R(on_battery=True), UserState(),
         State.WAITING, Reason.ON_BATTERY, "battery"),
        (Settings(), R(gpu=GpuReading(name="g", temperature_c=90.0)), UserState(),
         State.WAITING, Reason.TOO_HOT, "80 °C"),
        (Settings(), R(idle_s=5.0), UserState(), State.WAITING, Reason.USER_ACTIVE,
         "Resumes 3 minutes after you stop"),
        (Settings(), R(idle_s=None, idle_reason="Wayland"), UserState(),
         State.WAITING, Reason.IDLE_UNKNOWN, "Wayland"),
        (Settings(), R(gpu=GpuReading(name="g", other_utilization_percent=50.0)),
         UserState(), State.WAITING, Reason.GPU_BUSY, "another program"),
        (Settings(), R(other_cpu_percent=80.0), UserState(), State.WAITING,
         Reason.CPU_BUSY, "processor busy"),
    ],
)  # fmt: skip
def test_each_state_and_reason(
    settings: Settings, readings: Readings, user: UserState, state: State, reason: Reason, text: str
) -> None:
    d = run(settings, readings, user)
    assert (d.state, d.reason_code) == (state, reason)
    assert text in d.human_reason
    assert d.human_reason.endswith(".") and len(d.human_reason) < 140


def test_strict_priority_each_pair() -> None:
    settings, readings, user = everything_wrong()
    assert run(settings, readings, user).reason_code is Reason.PAUSED
    assert run(settings, readings, UserState(snooze_until_mono=2000.0)).reason_code is Reason.SNOOZED
    assert run(settings, readings, UserState()).reason_code is Reason.OUTSIDE_SCHEDULE
    s2 = Settings(monthly_data_cap_mib=1)
    d = run(s2, readings)
    assert (
        d.reason_code is Reason.DATA_CAP_REACHED
        and d.until == datetime(2025, 8, 1)
        and "1 August" in d.human_reason
    )
    assert run(Settings(), readings).reason_code is Reason.ON_BATTERY
    r = Readings(**{**_fields(readings), "on_battery": False})
    assert run(Settings(), r).reason_code is Reason.TOO_HOT
    r = Readings(
        **{**_fields(r), "gpu": GpuReading(name="g", temperature_c=50.0, other_utilization_percent=99.0)}
    )
    assert run(Settings(), r).reason_code is Reason.USER_ACTIVE
    r = Readings(**{**_fields(r), "idle_s": 600.0})
    assert run(Settings(), r).reason_code is Reason.GPU_BUSY
    r = Readings(**{**_fields(r), "gpu": GPU})
    assert run(Settings(), r).reason_code is Reason.CPU_BUSY
    r = Readings(**{**_fields(r), "other_cpu_percent": 0.0})
    assert run(Settings(), r).reason_code is Reason.RUNNING


def test_snooze_ends_on_monotonic_time_and_shows_wall_until() -> None:
    user = UserState(snooze_until_mono=1000.0 + 1800)
    d = run(user=user)
    assert d.until == WED_NOON + timedelta(minutes=30)
    assert run(user=user, now=Now(WED_NOON - timedelta(hours=5), 2800.0)).state is State.RUNNING


def test_user_active_until_and_threshold() -> None:
    d = run(readings=R(idle_s=60.0))
    assert d.until == WED_NOON + timedelta(seconds=120)
    assert run(readings=R(idle_s=180.0)).state is State.RUNNING


def test_gpu_idle_rule_vs_cpu_idle_rule() -> None:
    active = R(idle_s=1.0)
    # GPU in use: gpu_only_when_idle decides
    assert run(Settings(only_when_idle=False), active).reason_code is Reason.USER_ACTIVE
    assert run(Settings(gpu_only_when_idle=False), active).state is State.RUNNING
    # no GPU: only_when_idle decides
    cpu_only = Readings(**{**_fields(active), "gpu": GpuReading(reason="none")})
    assert run(Settings(gpu_only_when_idle=False), cpu_only).reason_code is Reason.USER_ACTIVE
    d = run(Settings(only_when_idle=False), cpu_only)
    assert d.state is State.RUNNING and "processor" in d.human_reason


def test_gpu_rules_ignored_when_gpu_not_used() -> None:
    hot_busy = Readings(
        **{**_fields(IDLE), "gpu": GpuReading(name="g", temperature_c=99.0, other_utilization_percent=99.0)}
    )
    assert run(Settings(use_gpu=False), hot_busy).state is State.RUNNING


def test_battery_allowed_and_unknown_battery() -> None:
    on_batt = R(on_battery=True)
    assert run(Settings(run_on_battery=True), on_batt).state is State.RUNNING
    assert run(Settings(), R(on_battery=None)).state is State.RUNNING


def test_too_hot_hysteresis() -> None:
    def at(temp: float, prev: Decision | None) -> Decision:
        return run(
            readings=R(gpu=GpuReading(name="g", temperature_c=temp)),
            previous=prev,
        )

    hot = at(81, None)
    assert hot.reason_code is Reason.TOO_HOT
    assert at(80, None).state is State.RUNNING
    assert at(76, hot).reason_code is Reason.TOO_HOT
    assert at(74, hot).state is State.RUNNING


def test_cpu_busy_hysteresis_and_off_switch() -> None:
    def at(load: float, prev: Decision | None, s: Settings = DEFAULT) -> Decision:
        return run(s, R(other_cpu_percent=load), previous=prev)

    busy = at(55, None)
    assert busy.reason_code is Reason.CPU_BUSY
    assert at(45, busy).reason_code is Reason.CPU_BUSY
    assert at(39, busy).state is State.RUNNING
    assert at(100, None, Settings(pause_when_other_cpu_percent=0)).state is State.RUNNING


def test_schedule_messages() -> None:
    d = run(Settings(schedule=Schedule(wed=("18:00-23:00",))))
    assert d.reason_code is Reason.OUTSIDE_SCHEDULE
    assert d.until == datetime(2025, 7, 16, 18, 0) and "at 18:00" in d.human_reason
    empty = Schedule(mon=(), tue=(), wed=(), thu=(), fri=(), sat=(), sun=())
    d = run(Settings(schedule=empty))
    assert d.reason_code is Reason.OUTSIDE_SCHEDULE and d.until is None and "no hours" in d.human_reason
    assert run(Settings(schedule=Schedule(tue=("22:00-13:00",), wed=()))).state is State.RUNNING  # overnight


def test_format_duration() -> None:
    assert [format_duration(s) for s in (1, 45, 60, 180, 3600, 5400)] == [
        "1 second", "45 seconds", "1 minute", "3 minutes", "1 hour", "1 hour 30 minutes"
    ]  # fmt: skip
