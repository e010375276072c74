"""NodeControl: the control commands applied to a running Volunteer and its Governor.

With a governor, pause/resume/snooze go through it (so its decision, reason and the work hooks stay the
one source of truth); without one (tests, demos) the Volunteer's hooks are called directly.
``set_limits`` merges the given fields into the file's settings, validates them with
``engine.resources.validated``, saves them (when a path is given) and applies them at once; ``reload``
applies the file's settings when another writer changed it (``engine.resources.SettingsWatcher``).
Either way the command line's ``overrides`` stay on top and never reach the file, which other nodes
may share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import torch

from engine.node import Volunteer
from engine.p2p import native
from engine.resources import (
    DataCapCounter,
    Decision,
    Reason,
    Settings,
    SettingsError,
    State,
    TokenBucket,
    apply_overrides,
    save_settings,
    validated,
)
from engine.resources.limits import apply_torch_limits
from engine.resources.settings import monthly_data_cap_bytes

from .headless import hint_for
from .protocol import ControlError

# Which torch build computes and which record layer the links use, for the tray's About box and bug
# reports (CPU or CUDA, and which; compiled DTLS records or the Python fallback, and why).
RUNTIME = {
    "torch": f"{torch.__version__} ({'CUDA ' + torch.version.cuda if torch.version.cuda else 'CPU build'})",
    "transport": native.status(),
}


class NodeControl:
    def __init__(
        self,
        volunteer: Volunteer,
        settings_path: Path | None = None,
        upload: TokenBucket | None = None,
        download: TokenBucket | None = None,
        traffic: DataCapCounter | None = None,
        on_shutdown: Callable[[], None] | None = None,
        *,
        overrides: Mapping[str, Any] | None = None,
        file_settings: Settings | None = None,
    ) -> None:
        """``upload``/``download``: the transport's buckets, retuned when the caps change; ``traffic``:
        the data-cap counter (today's and this month's bytes in status); ``on_shutdown``: what the
        ``shutdown`` command calls (the tray app's clean quit, the same on every OS); ``overrides``:
        the command line's limits; ``file_settings``: the file's, before them (default: the volunteer's)."""
        self.volunteer = volunteer
        self.settings_path = settings_path
        self.upload = upload
        self.download = download
        self.traffic = traffic
        self.on_shutdown = on_shutdown
        self.overrides = dict(overrides or {})
        self.file_settings = file_settings or volunteer.settings
        self._snooze: asyncio.TimerHandle | None = None

    def status(self) -> dict[str, Any]:
        status = self.volunteer.status()
        status["limits"] = msgspec.to_builtins(self.volunteer.settings)
        gov = self.volunteer.governor
        status["idle_source"] = (gov.idle.source or "node") if gov is not None else None
        status["hint"] = self.hint()
        status["overrides"] = dict(self.overrides)
        status["runtime"] = RUNTIME
        if self.traffic is not None:
            status["traffic"] = {
                **self.traffic.totals(),
                "cap_bytes": monthly_data_cap_bytes(self.volunteer.settings),
                "period_end": self.traffic.period_end().isoformat(timespec="minutes"),
            }
        return status

    def hint(self) -> str | None:
        """Why the node waits and which setting or flag would let it work (None while it works)."""
        gov = self.volunteer.governor
        gpu = self.volunteer.device.type == "cuda"
        decision = gov.decision if gov is not None else None
        return hint_for(decision, gpu=gpu, settings_file=self.settings_path, overrides=self.overrides)

    def refresh_credit(self) -> dict[str, Any]:
        """Someone looks at the credit (the tray's status window): read it from the coordinator now. The
        reply does not wait for the coordinator (a pause on the same connection must never queue behind
        a slow one): the new value comes with the status, ``credit_at`` says when it was read."""
        started = self.volunteer.refresh_credit()
        return {"reading": started, "credit_at": self.volunteer.credit_at}

    def shutdown(self) -> None:
        if self.on_shutdown is None:
            raise ControlError("unsupported", "this node cannot be stopped through the control API")
        self.on_shutdown()

    def feed_idle(self, seconds: float, source: str) -> None:
        """The tray app's reading of the user's idle time (it sees input the node may not)."""
        gov = self.volunteer.governor
        if gov is None:
            raise ControlError("no_governor", "this node does not watch for idleness")
        try:
            gov.feed_idle(seconds, source)
        except ValueError as e:
            raise ControlError("bad_request", str(e)) from e

    async def pause(self) -> None:
        gov = self.volunteer.governor
        if gov is not None:
            gov.pause()
            await self._stopped(State.PAUSED, "Paused by you")
        else:
            await self.volunteer.on_stop_work(Decision(State.PAUSED, Reason.PAUSED, "Paused by you"))

    async def resume(self) -> None:
        self._cancel_snooze()
        gov = self.volunteer.governor
        if gov is not None:
            gov.resume()
            await self._settle(lambda d: d.state not in (State.PAUSED, State.SNOOZED))
        else:
            await self.volunteer.on_resume_work(Decision(State.RUNNING, Reason.RUNNING, "Running"))

    async def snooze(self, seconds: float) -> None:
        gov = self.volunteer.governor
        if gov is not None:
            gov.snooze(seconds)
            await self._stopped(State.SNOOZED, "Snoozed by you")
            return
        await self.volunteer.on_stop_work(
            Decision(State.SNOOZED, Reason.SNOOZED, f"Snoozed for {seconds:.0f} s")
        )
        self._cancel_snooze()
        loop = asyncio.get_running_loop()
        self._snooze = loop.call_later(seconds, lambda: loop.create_task(self.resume()))

    def _cancel_snooze(self) -> None:
        if self._snooze is not None:
            self._snooze.cancel()
            self._snooze = None

    async def _stopped(self, state: State, reason: str, timeout: float = 2.0) -> None:
        """Pause and snooze: refuse new work at once, and reply as soon as the governor has decided.

        Its work hook (draining, freeing memory) goes on after the reply: the volunteer asked the node
        to stop taking work, and that is done the moment the gate closes, however long freeing takes.
        """
        gov = self.volunteer.governor
        assert gov is not None
        self.volunteer.gate.close(reason)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # no event marks "decided" (only "published", after the hooks): poll the decision briefly
        while loop.time() < deadline:
            if gov.decision is not None and gov.decision.state is state:
                return
            await asyncio.sleep(0.005)

    async def _settle(self, done: Callable[[Decision], bool], timeout: float = 10.0) -> None:
        """Wait (bounded) until the governor has acted on the change, so the reply shows the new status.

        The governor publishes a decision only after its work hooks ran, so seeing it published is enough.
        A resume right after a pause waits for the pause's hook (freeing memory) and then its own
        (restoring it): seconds on a loaded machine, hence the generous bound.
        """
        gov = self.volunteer.governor
        assert gov is not None
        queue = gov.subscribe()
        try:
            async with asyncio.timeout(timeout):
                # The queue starts with the last *published* decision, which may predate one still in
                # its hooks (a pause just decided): wait until what is published is also what is decided.
                while True:
                    published = await queue.get()
                    if done(published) and gov.decision is not None and done(gov.decision):
                        break
        except TimeoutError:
            pass
        finally:
            gov.unsubscribe(queue)

    async def set_limits(self, limits: dict[str, Any]) -> dict[str, Any]:
        current = msgspec.to_builtins(self.file_settings)
        unknown = sorted(set(limits) - set(current))
        if unknown:
            raise ControlError("bad_request", f"unknown setting(s): {', '.join(unknown)}")
        try:
            settings = validated(msgspec.convert({**current, **limits}, Settings))
        except (msgspec.ValidationError, SettingsError) as e:
            raise ControlError("invalid_limits", str(e)) from e
        if self.settings_path is not None:
            try:
                save_settings(settings, self.settings_path)
            except SettingsError as e:
                raise ControlError("save_failed", str(e)) from e
        self.file_settings = settings
        effective = self.apply(apply_overrides(settings, self.overrides))
        result: dict[str, Any] = msgspec.to_builtins(effective)
        return result

    def reload(self, settings: Settings) -> list[str]:
        """The settings file changed under us: apply it (overrides on top). Returns the names of the
        settings that changed in the file, empty when it says what we run with already (our own save)."""
        before = msgspec.structs.asdict(self.file_settings)
        changed = [k for k, v in msgspec.structs.asdict(settings).items() if before.get(k) != v]
        if changed:
            self.file_settings = settings
            self.apply(apply_overrides(settings, self.overrides))
        return changed

    def apply(self, settings: Settings) -> Settings:
        """Run with ``settings`` from now on: the governor decides by them, torch and the transport's
        buckets follow at once. (The device and the data-cap period are chosen at start.)"""
        self.volunteer.settings = settings
        if self.volunteer.governor is not None:
            self.volunteer.governor.set_settings(settings)
        apply_torch_limits(settings)
        if self.upload is not None:
            self.upload.set_rate(settings.max_upload_kib_s * 1024)  # 0: unlimited
        if self.download is not None:
            self.download.set_rate(settings.max_download_kib_s * 1024)
        return settings
