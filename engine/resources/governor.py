"""The governor: polls readings, runs ``decide``, tells the node to stop or resume and the tray why.

Polling is cheap and adaptive: every ``running_interval`` (0.25 s) while running, so new work stops within
a second of user input; every ``waiting_interval`` while waiting for the user to leave; every
``slow_interval`` while waiting on slower readings; every ``parked_interval`` when paused, snoozed, outside
the schedule or over the data cap (a snooze deadline shortens the sleep). Idle time is read on the loop
each tick; the full reading (CPU, battery, GPU, data) runs in a worker thread every ``full_interval`` and
never holds up a tick.

Intervals use the monotonic clock. The wall clock is read only for the schedule and the data-cap period; a
jump (wall time moving more than ``jump_tolerance_s`` off monotonic time) is counted, forces a full read
and republishes the decision, since the schedule or ``until`` may have changed.

Work hooks (``on_stop_work`` / ``on_resume_work``) are awaited on every change between working and not
working; the first decision counts as a change from "not working". Listeners and subscriber queues get
every decision whose state, reason or text changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Protocol

from .decision import Decision, Now, Reason, State, UserState, decide, uses_gpu
from .energy import EnergyMeter
from .idle import FedIdle, IdleReading
from .sensors import Readings
from .settings import Settings

log = logging.getLogger(__name__)

Listener = Callable[[Decision], None]
_PARKED = {Reason.PAUSED, Reason.SNOOZED, Reason.OUTSIDE_SCHEDULE, Reason.DATA_CAP_REACHED}


class SensorSource(Protocol):
    def idle(self) -> IdleReading: ...

    def full(self) -> Readings: ...


class WorkHooks(Protocol):
    async def on_stop_work(self, decision: Decision) -> None:
        """Stop taking new requests at once; drain or hand off in-flight work; free GPU memory."""

    async def on_resume_work(self, decision: Decision) -> None:
        """Start taking requests again."""


class Governor:
    def __init__(
        self,
        settings: Settings,
        sensors: SensorSource,
        hooks: WorkHooks | None = None,
        *,
        wall: Callable[[], datetime] = datetime.now,
        mono: Callable[[], float] = time.monotonic,
        running_interval: float = 0.25,
        waiting_interval: float = 1.0,
        slow_interval: float = 2.0,
        parked_interval: float = 5.0,
        full_interval: float = 2.0,
        hook_timeout: float = 10.0,
        jump_tolerance_s: float = 2.0,
        energy: EnergyMeter | None = None,
    ) -> None:
        self.settings = settings
        self._sensors = sensors
        self._hooks = hooks
        self._wall = wall
        self._mono = mono
        self.running_interval = running_interval
        self.waiting_interval = waiting_interval
        self.slow_interval = slow_interval
        self.parked_interval = parked_interval
        self.full_interval = full_interval
        self.hook_timeout = hook_timeout
        self.jump_tolerance_s = jump_tolerance_s
        self.energy = energy
        self.idle = FedIdle(sensors.idle)  # the tray app's reading wins while fresh (see idle.py)
        self.user_state = UserState()
        self.clock_jumps = 0
        self.ticks = 0
        self._decision: Decision | None = None
        self._published: Decision | None = None
        self._working = False
        self._full = Readings()
        self._have_full = False
        self._next_full = float("-inf")
        self._full_task: asyncio.Task[Readings] | None = None
        self._last_clock: tuple[datetime, float] | None = None
        self._listeners: list[Listener] = []
        self._queues: list[asyncio.Queue[Decision]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- what the tray and node use ---------------------------------------------------------------------

    @property
    def decision(self) -> Decision | None:
        return self._decision

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def subscribe(self, maxsize: int = 32) -> asyncio.Queue[Decision]:
        """A queue of decisions; when full, the oldest is dropped (the newest always matters most)."""
        q: asyncio.Queue[Decision] = asyncio.Queue(maxsize)
        self._queues.append(q)
        if self._published is not None:
            q.put_nowait(self._published)
        return q

    def unsubscribe(self, q: asyncio.Queue[Decision]) -> None:
        with contextlib.suppress(ValueError):
            self._queues.remove(q)

    def pause(self) -> None:
        self.user_state = UserState(paused=True)
        self._wake.set()

    def resume(self) -> None:
        self.user_state = UserState()
        self._wake.set()

    def snooze(self, seconds: float) -> None:
        self.user_state = UserState(snooze_until_mono=self._mono() + seconds)
        self._wake.set()

    def feed_idle(self, seconds: float, source: str) -> None:
        """The user's idle time as the tray app sees it (ValueError if implausible). Input seen by the app
        wakes the loop at once, so work stops as soon as the reading arrives."""
        was = self.idle.read().seconds
        self.idle.feed(seconds, source)
        if was is None or seconds + 0.5 < was:
            self._wake.set()

    def set_settings(self, settings: Settings) -> None:
        self.settings = settings
        self._next_full = float("-inf")
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="resource-governor")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._full_task is not None:
            self._full_task.cancel()
            self._full_task = None

    async def run(self) -> None:
        while True:
            self._wake.clear()  # before the poll: a wake that arrives while it runs is not lost
            decision = await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_for(decision))

    def interval_for(self, decision: Decision) -> float:
        if decision.state is State.RUNNING:
            return self.running_interval
        if decision.reason_code in (Reason.USER_ACTIVE, Reason.IDLE_UNKNOWN):
            return self.waiting_interval
        if decision.reason_code in _PARKED:
            snooze = self.user_state.snooze_until_mono
            if snooze is not None and decision.reason_code is Reason.SNOOZED:
                return max(0.01, min(self.parked_interval, snooze - self._mono()))
            return self.parked_interval
        return self.slow_interval

    def _jumped(self, wall: datetime, mono: float) -> bool:
        last, self._last_clock = self._last_clock, (wall, mono)
        if last is None:
            return False
        expected = (wall - last[0]).total_seconds() - (mono - last[1])
        if abs(expected) > self.jump_tolerance_s:
            self.clock_jumps += 1
            log.info("wall clock moved %+.0f s against the monotonic clock", expected)
            return True
        return False

    async def _refresh_full(self, mono: float, jumped: bool) -> None:
        task = self._full_task
        if task is not None and task.done():
            self._full_task = None
            try:
                self._full, self._have_full = task.result(), True
            except Exception:
                log.exception("full reading failed; keeping the previous one")
            if self.energy is not None and self._decision is not None:
                gpu = uses_gpu(self.settings, self._full)
                self.energy.update(mono, self._working, self._full.gpu.power_w if gpu else None)
        if self._full_task is None and (mono >= self._next_full or jumped):
            self._next_full = mono + self.full_interval
            self._full_task = asyncio.create_task(asyncio.to_thread(self._sensors.full))
            if not self._have_full:  # the first decision waits for real readings (bounded)
                await asyncio.wait({self._full_task}, timeout=5.0)
                await self._refresh_full(mono, False)

    async def poll(self) -> Decision:
        """One tick: read, decide, act on a change. Returns the decision."""
        self.ticks += 1
        mono, wall = self._mono(), self._wall()
        jumped = self._jumped(wall, mono)
        idle = self.idle.read()
        await self._refresh_full(mono, jumped)
        readings = replace(self._full, idle_s=idle.seconds, idle_reason=idle.reason)
        decision = decide(self.settings, readings, Now(wall, mono), self.user_state, self._decision)
        self._decision = decision
        if decision.working != self._working or self._published is None:
            self._working = decision.working
            await self._call_hook(decision)
        last = self._published
        if (
            jumped
            or last is None
            or (last.state, last.reason_code, last.human_reason)
            != (
                decision.state,
                decision.reason_code,
                decision.human_reason,
            )
        ):
            self._publish(decision)
        return decision

    async def _call_hook(self, decision: Decision) -> None:
        if self._hooks is None:
            return
        hook = self._hooks.on_resume_work if decision.working else self._hooks.on_stop_work
        try:
            await asyncio.wait_for(hook(decision), self.hook_timeout)
        except Exception:
            log.exception("work hook %s failed", hook.__name__)

    def _publish(self, decision: Decision) -> None:
        self._published = decision
        for listener in list(self._listeners):
            try:
                listener(decision)
            except Exception:
                log.exception("governor listener failed")
        for q in self._queues:
            if q.full():
                q.get_nowait()
            q.put_nowait(decision)
