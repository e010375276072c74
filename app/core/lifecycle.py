"""Lifecycle: what state the tray app is in and what it does next, with no Qt in sight.

The app goes: first run (the wizard; nothing runs and nothing is sent) -> registering (after "Start
contributing") -> joined -> the node started, then running, paused, restarting or failed as the node
and its status say -> quitting -> done. A volunteer who already joined starts at the node. Every
decision on that path lives here: which window the first run gets, what registration saves, when the
node and the update check start, what the tray shows, which notices are told (once), what the
volunteer's commands and settings do, and the order of a clean Quit.

It is driven by method calls (``start``, ``register``, ``wizard_closed``, ``node_changed``,
``status_received``, ``link_changed``, ``command``, ``resume``, ``apply_settings``, ``quit``) and
reports through its ``Host`` (:mod:`app.core.host`): the Qt controller (``app.qt.controller``) owns the
windows, the node's process, the control link and the loop thread, and only forwards their events here;
a test drives it with a recording host and no event loop. Files it writes itself (``app.toml``,
``settings.toml``, the login entry): they are plain I/O, not Qt. When an outage is worth telling is
:mod:`app.core.notices`'s call.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec

from engine.account.tokens import Credentials
from engine.resources import Settings, SettingsError, load_settings, save_settings

from . import autostart, registration
from .activity import Activity, milestone_crossed
from .config import AppConfig, load_config, save_config
from .consent import Consent, FirstRun
from .errors import ConfigError, RegistrationError
from .host import Host, Reply
from .notices import UnreachableWatch
from .paths import AppPaths
from .presentation import present
from .registration import TokenPlace

log = logging.getLogger(__name__)

Register = Callable[..., Coroutine[Any, Any, tuple[Credentials, TokenPlace]]]


class Phase(StrEnum):
    NEW = "new"  # built, not started
    FIRST_RUN = "first_run"  # the wizard is open: nothing runs, nothing was sent
    REGISTERING = "registering"  # "Start contributing" pressed: the account is being created
    JOINED = "joined"  # registered and saved; the wizard is closing
    STARTING = "starting"  # the node is started, and does not answer yet
    RUNNING = "running"  # the node answers: contributing, waiting or joining (its status says which)
    PAUSED = "paused"  # the node answers and is paused or snoozed
    RESTARTING = "restarting"  # the node exited; it is started again after a back-off
    FAILED = "failed"  # the node kept failing: no more restarts until Resume
    QUITTING = "quitting"  # Quit: the windows are gone, the node is being stopped
    DONE = "done"  # everything stopped: the app leaves


class Lifecycle:
    """The app's state and its transitions. ``register``, ``place`` and ``set_autostart`` are the
    registration and login-entry functions, and ``clock`` the monotonic clock, replaced in tests."""

    def __init__(
        self,
        host: Host,
        paths: AppPaths,
        *,
        coordinator: str | None = None,
        demo: bool = False,
        register: Register = registration.register,
        place: Callable[[Path], TokenPlace] = registration.token_place,
        set_autostart: Callable[[bool], None] = autostart.set_enabled,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.paths = paths
        self.demo = demo
        self._register_account = register
        self._token_place = place
        self._set_autostart = set_autostart
        self._clock = clock
        self.config, self.config_warnings = load_config(paths.config)
        if coordinator and not self.config.consented:
            self.config = msgspec.structs.replace(self.config, coordinator_url=coordinator.rstrip("/"))
        self.settings, self.settings_warnings = load_settings(paths.settings)
        if demo and not paths.settings.exists():
            # A demo contributes while you watch it, beside the demo swarm's own busy processes.
            self.settings = msgspec.structs.replace(
                self.settings, only_when_idle=False, gpu_only_when_idle=False, pause_when_other_cpu_percent=0
            )
        self.status: dict[str, Any] | None = None
        self.view = present(None, "stopped", "Not started yet.", False)
        self.activity = Activity()
        self._stage = Phase.NEW  # STARTING stands for "the node was started": ``phase`` refines it
        self._rendered = False
        self._unreachable = UnreachableWatch()

    @property
    def phase(self) -> Phase:
        """Where the app is; once the node was started, read off its process and its status."""
        if self._stage is not Phase.STARTING:
            return self._stage
        node = self.host.node_state()
        state = node[0] if node else "stopped"
        if state == "gave_up":
            return Phase.FAILED
        if state == "restarting":
            return Phase.RESTARTING
        if self.status is None or not self.host.node_connected():
            return Phase.STARTING
        return Phase.PAUSED if self.status.get("state") in ("paused", "snoozed") else Phase.RUNNING

    # -- starting ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Repaired settings are told first; then the first run, or straight to work for one who joined."""
        for warning in self.config_warnings + self.settings_warnings:
            self.host.notify("Settings repaired", warning)
        self.host.show_tray()
        self._render()
        if self.config.consented:
            self._go_to_work()
        else:
            self._stage = Phase.FIRST_RUN
            place = self._token_place(self.paths.data)
            self.host.show_wizard(
                FirstRun(
                    self.settings,
                    self.config.coordinator_url,
                    place.description,
                    name=self.config.display_name or ("you" if self.demo else ""),
                    team=self.config.team,
                    autostart=not self.demo,
                )
            )

    def _go_to_work(self) -> None:
        self._stage = Phase.STARTING
        self._show_window_once()
        self.host.start_node()
        self._start_updates()

    def _start_updates(self) -> None:
        """Only once the volunteer joined (nothing is sent before), and from the server they joined:
        it names where releases are published, or that it names none (then nothing is checked)."""
        if not self.demo:
            self.host.start_updates(self.config.coordinator_url)

    def _show_window_once(self) -> None:
        if self.host.show_window() and not self.config.no_tray_noted:
            self.host.notify(
                "No tray icon here", "Learning@home shows a small window instead of a tray icon."
            )
            self._save_config(msgspec.structs.replace(self.config, no_tray_noted=True))

    # -- first run ---------------------------------------------------------------------------------------

    def register(self, consent: Consent, reply: Reply) -> None:
        """ "Start contributing": create the account off the GUI thread, then keep the volunteer's choices.
        ``reply(None)`` lets the wizard close; a sentence keeps it open to try again."""
        if self._stage is Phase.FIRST_RUN:
            self._stage = Phase.REGISTERING

        def finished(result: Any, error: BaseException | None) -> None:
            if error is not None:
                self._back_to_first_run()
                text = str(error) if isinstance(error, RegistrationError) else f"Registration failed: {error}"
                reply(text)
                return
            credentials, place = result
            try:
                save_settings(consent.settings, self.paths.settings)
                self._save_config(
                    msgspec.structs.replace(
                        self.config,
                        consented=True,
                        consented_at=datetime.now().isoformat(timespec="seconds"),
                        coordinator_url=consent.coordinator_url,
                        display_name=consent.display_name,
                        team=consent.team,
                        account_id=credentials.account_id,
                        autostart=consent.autostart,
                        token_file=str(place.file) if place.file else "",
                    )
                )
            except (SettingsError, ConfigError) as e:
                self._back_to_first_run()
                reply(f"Your choices could not be saved: {e}")
                return
            self.settings = consent.settings
            if self._stage is Phase.REGISTERING:
                self._stage = Phase.JOINED
            reply(None)

        self.host.run(
            self._register_account(
                consent.coordinator_url,
                consent.display_name,
                consent.team,
                self.paths.data,
                invite=consent.invite,
            ),
            finished,
        )

    def _back_to_first_run(self) -> None:
        if self._stage is Phase.REGISTERING:  # not after the wizard was closed meanwhile
            self._stage = Phase.FIRST_RUN

    def wizard_closed(self) -> None:
        """Closed without consenting: nothing ran and nothing stays, so the app leaves. Else to work."""
        if not self.config.consented:
            self.quit()
            return
        self._apply_autostart(self.config.autostart)
        self._go_to_work()

    # -- the node ----------------------------------------------------------------------------------------

    def node_args(self) -> list[str]:
        """``lah node`` arguments for the volunteer who joined: the server, the name, where the token is."""
        c = self.config
        args = ["--coordinator", c.coordinator_url]
        if c.display_name:
            args += ["--name", c.display_name]
        if c.team:
            args += ["--team", c.team]
        if c.token_file:
            args += ["--token-file", c.token_file]
        return args

    def node_changed(self, state: str, text: str) -> None:
        """The node's process changed state (``NodeSupervisor``'s states)."""
        if state == "gave_up":
            self.host.notify("Learning@home stopped", f"{text} Log: {self.paths.logs / 'node.log'}")
        self._render()

    def link_changed(self) -> None:
        """The node's control API started or stopped answering."""
        self._render()

    def status_received(self, status: dict[str, Any]) -> None:
        """A status from the node (its stream, or a command's reply): the chart, milestones, notices."""
        self.status = status
        new_point = self.activity.add(status, self._clock()) is not None
        credit = status.get("credit")
        if isinstance(credit, int | float):
            crossed = milestone_crossed(self.config.credit_milestone, float(credit))
            if crossed is not None:
                self.host.notify(
                    "Thank you!", f"Your computer has earned {crossed:,.0f} credit for the project."
                )
                self._save_config(msgspec.structs.replace(self.config, credit_milestone=crossed), quiet=True)
        self._watch_unreachable(status)
        self.host.show_node_status(status, new_point)
        self._render()

    def _watch_unreachable(self, status: dict[str, Any]) -> None:
        if self._unreachable.tell(status, self._clock):
            self.host.notify(
                "Cannot reach the project",
                "Learning@home cannot reach the project's server and keeps trying. Nothing is lost.",
            )

    def _render(self) -> None:
        node = self.host.node_state()
        connected = self.host.node_connected()
        view = present(
            self.status if connected else None,
            node[0] if node else "stopped",
            node[1] if node else self._waiting_text(),
            connected,
        )
        if view == self.view and self._rendered:
            return  # most status updates change counters, not what the tray shows
        self.view, self._rendered = view, True
        self.host.render(view)

    def _waiting_text(self) -> str:
        return "Not started yet." if self.config.consented else "Waiting for you to join."

    # -- the volunteer's commands ------------------------------------------------------------------------

    def command(self, cmd: str, **args: Any) -> None:
        """Pause, snooze, resume...: the node answers with its new status, or the volunteer is told why."""

        def done(result: Any, error: BaseException | None) -> None:
            if error is not None:
                self.host.notify("Learning@home", f"Could not {cmd}: {getattr(error, 'message', error)}")
            elif isinstance(result, dict) and "state" in result:
                self.status_received(result)

        self.host.send(cmd, done, **args)

    def resume(self) -> None:
        """Resume a paused node; after it was given up on, start it again."""
        node = self.host.node_state()
        if node is not None and node[0] == "gave_up":
            self.host.restart_node()
            return
        self.command("resume")

    def site_url(self) -> str:
        """The volunteer's own page on the project's site, or its leaderboard before the account is known."""
        base = self.config.coordinator_url
        return (
            f"{base}/contributors/{self.config.account_id}"
            if self.config.account_id
            else f"{base}/leaderboard"
        )

    def current_settings(self) -> Settings:
        """The limits in force: the running node's, else the file's."""
        limits = self.status.get("limits") if self.status else None
        current = self.settings
        if isinstance(limits, dict):
            with contextlib.suppress(msgspec.ValidationError):
                current = msgspec.convert(limits, Settings)
        return current

    def apply_settings(self, limits: dict[str, Any], autostart_on: bool, reply: Reply) -> None:
        """The Settings window's Apply: the login entry here, the limits live through the node (or into the
        file it reads at its next start, when none runs)."""
        problems = []
        if autostart_on != self.config.autostart:
            if not self._apply_autostart(autostart_on):
                problems.append("The login entry could not be changed.")
            else:
                problems += self._save_config(msgspec.structs.replace(self.config, autostart=autostart_on))

        def finished(result: Any, error: BaseException | None) -> None:
            if error is None:
                self.settings = msgspec.convert(result, Settings)
                reply(" ".join(problems) or None)
                return
            if getattr(error, "code", "") == "not_running":  # no node now: it reads the file when it starts
                try:
                    settings = msgspec.convert({**msgspec.to_builtins(self.settings), **limits}, Settings)
                    save_settings(settings, self.paths.settings)
                    self.settings = settings
                    reply("Saved. The engine is not running; it will use them when it starts.")
                except (SettingsError, msgspec.ValidationError) as e:
                    reply(str(e))
                return
            reply(getattr(error, "message", str(error)))

        self.host.send("set_limits", finished, limits=limits)

    def _apply_autostart(self, enabled: bool) -> bool:
        try:
            self._set_autostart(enabled)
            return True
        except OSError as e:
            self.host.notify("Start at login", f"Could not change the login entry: {e}")
            return False

    def _save_config(self, config: AppConfig, quiet: bool = False) -> list[str]:
        """Kept in memory whatever happens; a file that cannot be written is told (unless ``quiet``)."""
        self.config = config
        try:
            save_config(config, self.paths.config)
            return []
        except ConfigError as e:
            if not quiet:
                self.host.notify("Settings not saved", str(e))
            return [str(e)]

    # -- quitting ----------------------------------------------------------------------------------------

    def quit(self) -> None:
        """Stop the node cleanly (checkpoints written), then leave; bounded even if the node hangs."""
        if self._stage in (Phase.QUITTING, Phase.DONE):
            return
        self._stage = Phase.QUITTING
        self.host.wind_down(self._finished)

    def _finished(self) -> None:
        self._stage = Phase.DONE
        self.host.finish()

