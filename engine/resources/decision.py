"""The governor's decision as one pure function: settings + readings + time + the user's choice -> state.

States and reasons, in priority order (the first that applies wins, so the tray shows the reason that
lasts longest or that the volunteer chose):

    paused    paused             the volunteer paused it
    snoozed   snoozed            the volunteer snoozed it until a time
    waiting   outside_schedule   outside the allowed hours            until: next allowed minute
              data_cap_reached   this month's data cap is used up     until: the next period
              on_battery         running on battery
              too_hot            the GPU is over its ceiling (resumes 5 °C below it)
              idle_unknown       "only when idle", but the system cannot say whether anyone is there
              user_active        input within the idle threshold      until: if no more input
              gpu_busy           another program is using the GPU
              cpu_busy           other programs keep the CPU busy (resumes 10 points below the limit)
    running   running

Hysteresis needs the previous decision, passed as ``previous``. Snooze deadlines are monotonic seconds
(a clock jump neither shortens nor lengthens them); the schedule and the data-cap period use wall time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from .schedule import describe_when, next_allowed, week_intervals
from .sensors import Readings
from .settings import Settings, monthly_data_cap_bytes

TOO_HOT_HYSTERESIS_C = 5.0
CPU_BUSY_HYSTERESIS = 10.0


class State(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    SNOOZED = "snoozed"
    WAITING = "waiting"


class Reason(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    SNOOZED = "snoozed"
    OUTSIDE_SCHEDULE = "outside_schedule"
    DATA_CAP_REACHED = "data_cap_reached"
    ON_BATTERY = "on_battery"
    TOO_HOT = "too_hot"
    IDLE_UNKNOWN = "idle_unknown"
    USER_ACTIVE = "user_active"
    GPU_BUSY = "gpu_busy"
    CPU_BUSY = "cpu_busy"


@dataclass(frozen=True, slots=True)
class Now:
    wall: datetime  # local, naive: for the schedule, the data-cap period and what the tray shows
    mono: float  # monotonic seconds: for every interval


@dataclass(frozen=True, slots=True)
class UserState:
    paused: bool = False
    snooze_until_mono: float | None = None  # monotonic deadline


@dataclass(frozen=True, slots=True)
class Decision:
    state: State
    reason_code: Reason
    human_reason: str
    until: datetime | None = None  # wall time it should end, when known

    @property
    def working(self) -> bool:
        return self.state is State.RUNNING


def uses_gpu(settings: Settings, readings: Readings) -> bool:
    return settings.use_gpu and readings.gpu.present


def format_duration(seconds: float) -> str:
    """60 -> '1 minute', 180 -> '3 minutes', 5400 -> '1 hour 30 minutes', 45 -> '45 seconds'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} second{'s' if s != 1 else ''}"
    h, m = divmod(round(s / 60), 60)
    parts = [f"{h} hour{'s' if h != 1 else ''}"] if h else []
    if m or not h:
        parts.append(f"{m} minute{'s' if m != 1 else ''}")
    return " ".join(parts)


def _wait(reason: Reason, text: str, until: datetime | None = None) -> Decision:
    return Decision(State.WAITING, reason, text, until)


def decide(
    settings: Settings,
    readings: Readings,
    now: Now,
    user_state: UserState,
    previous: Decision | None = None,
) -> Decision:
    was = previous.reason_code if previous is not None else None
    if user_state.paused:
        return Decision(State.PAUSED, Reason.PAUSED, "Paused by you. Choose Resume to contribute again.")
    if user_state.snooze_until_mono is not None and now.mono < user_state.snooze_until_mono:
        until = now.wall + timedelta(seconds=user_state.snooze_until_mono - now.mono)
        return Decision(
            State.SNOOZED,
            Reason.SNOOZED,
            f"Snoozed until {until.strftime('%H:%M')}.",
            until.replace(microsecond=0),
        )

    intervals = week_intervals(settings.schedule.days())
    start = next_allowed(intervals, now.wall)
    if start is None:
        return _wait(
            Reason.OUTSIDE_SCHEDULE, "Waiting: your schedule allows no hours. Change it to contribute."
        )
    if start != now.wall:
        return _wait(
            Reason.OUTSIDE_SCHEDULE,
            f"Waiting: outside your allowed hours. Resumes {describe_when(start, now.wall)}.",
            start,
        )

    cap = monthly_data_cap_bytes(settings)
    if cap is not None and readings.data_used_bytes >= cap:
        end = readings.data_period_end
        when = f" Resumes on {end.day} {end.strftime('%B')}." if end is not None else ""
        return _wait(
            Reason.DATA_CAP_REACHED,
            f"Paused: this month's data limit ({cap / 1e9:.3g} GB) is used up.{when}",
            end,
        )

    if readings.on_battery and not settings.run_on_battery:
        return _wait(Reason.ON_BATTERY, "Paused: the computer is on battery. Resumes when you plug it in.")

    gpu = uses_gpu(settings, readings)
    temp = readings.gpu.temperature_c
    if gpu and temp is not None:
        ceiling = float(settings.gpu_max_temperature_c)
        hot = temp >= ceiling - TOO_HOT_HYSTERESIS_C if was is Reason.TOO_HOT else temp > ceiling
        if hot:
            return _wait(
                Reason.TOO_HOT,
                f"Paused: the graphics card is too hot (over {settings.gpu_max_temperature_c} °C). "
                "Resumes when it cools down.",
            )

    if (settings.gpu_only_when_idle if gpu else settings.only_when_idle) and settings.idle_after_s > 0:
        if readings.idle_s is None:
            why = f" ({readings.idle_reason})" if readings.idle_reason else ""
            return _wait(
                Reason.IDLE_UNKNOWN,
                f"Waiting: this computer does not say whether you're using it{why}. "
                "Turn off 'only when idle' to contribute anyway.",
            )
        if readings.idle_s < settings.idle_after_s:
            left = settings.idle_after_s - readings.idle_s
            return _wait(
                Reason.USER_ACTIVE,
                f"Paused: you're using the computer. Resumes {format_duration(settings.idle_after_s)} "
                "after you stop.",
                (now.wall + timedelta(seconds=left)).replace(microsecond=0),
            )

    other_gpu = readings.gpu.other_utilization_percent
    busy_gpu = settings.pause_when_other_gpu_percent
    if gpu and busy_gpu and other_gpu is not None and other_gpu >= busy_gpu:
        return _wait(Reason.GPU_BUSY, "Paused: another program is using the graphics card.")

    other_cpu = readings.other_cpu_percent
    if settings.pause_when_other_cpu_percent and other_cpu is not None:
        limit = float(settings.pause_when_other_cpu_percent)
        if was is Reason.CPU_BUSY:
            limit = max(0.0, limit - CPU_BUSY_HYSTERESIS)
        if other_cpu >= limit:
            return _wait(Reason.CPU_BUSY, "Paused: other programs are keeping the processor busy.")

    where = "graphics card" if gpu else "processor"
    return Decision(State.RUNNING, Reason.RUNNING, f"Contributing with your {where}.")
