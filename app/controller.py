"""AppController: the app's composition. First run (wizard) or straight to work; the node as a child
process; its status in the tray, the windows and notifications; the volunteer's commands back to it.

Everything here runs on the GUI thread and only for moments: network and disk-heavy work goes through
``Bridge`` (registration, control commands) or QProcess (the node), and their answers come back as
signals. The app never imports torch: what it knows of the engine comes through the control API.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
from PySide6.QtCore import QObject, QTimer, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QApplication, QSystemTrayIcon, QWidget

from engine.control import data_dir
from engine.resources import Settings, SettingsError, load_settings, save_settings, settings_path

from . import autostart
from .about import show_about
from .actions import Actions
from .activity import Activity, milestone_crossed
from .assets import icon
from .bridge import Bridge
from .config import AppConfig, config_path, load_config, save_config
from .control_window import ControlWindow
from .errors import ConfigError, RegistrationError
from .idle import session_idle_reader
from .node_link import NodeLink
from .presentation import present
from .registration import register, token_place
from .supervisor import NodeSupervisor, node_command
from .update_check import UpdateChecker
from .update_policy import STATE_NAME

log = logging.getLogger(__name__)

UNREACHABLE_NOTIFY_S = 60.0
CREDIT_REFRESH_S = 30.0  # while the status window is open: the node reads the credit this often
TOMORROW_HOUR = 7  # "Snooze until tomorrow": until 07:00 the next morning


@dataclass(frozen=True)
class AppPaths:
    config: Path
    settings: Path
    data: Path
    logs: Path

    @classmethod
    def default(cls) -> AppPaths:
        import platformdirs

        return cls(
            config_path(),
            settings_path(),
            data_dir(),
            Path(platformdirs.user_log_dir("learning-at-home", appauthor=False)),
        )


class AppController(QObject):
    def __init__(
        self,
        qapp: QApplication,
        *,
        paths: AppPaths | None = None,
        coordinator: str | None = None,
        demo: bool = False,
        use_tray: bool | None = None,
        node_cmd: list[str] | None = None,
        supervisor_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.qapp = qapp
        self.paths = paths or AppPaths.default()
        self.demo = demo
        self.config, self.config_warnings = load_config(self.paths.config)
        if coordinator and not self.config.consented:
            self.config = msgspec.structs.replace(self.config, coordinator_url=coordinator.rstrip("/"))
        self.settings, self.settings_warnings = load_settings(self.paths.settings)
        if demo and not self.paths.settings.exists():
            # A demo contributes while you watch it, beside the demo swarm's own busy processes.
            self.settings = msgspec.structs.replace(
                self.settings, only_when_idle=False, gpu_only_when_idle=False, pause_when_other_cpu_percent=0
            )
        self.bridge = Bridge(self)
        reader, source = session_idle_reader()
        self.link = NodeLink(self.bridge, idle_reader=lambda: (reader(), source), parent=self)
        self._node_cmd = node_cmd
        self._supervisor_options = supervisor_options or {}
        self.supervisor: NodeSupervisor | None = None
        self.status: dict[str, Any] | None = None
        self.view = present(None, "stopped", "Not started yet.", False)
        self.activity = Activity()
        self.actions = Actions(self)
        self._connect_actions()
        self.use_tray = QSystemTrayIcon.isSystemTrayAvailable() if use_tray is None else use_tray
        self.tray: QSystemTrayIcon | None = None
        self.window: ControlWindow | None = None
        self.status_window: Any = None
        self._credit_timer: QTimer | None = None
        self.settings_window: Any = None
        self.wizard: Any = None
        self._dialogs: list[QWidget] = []
        self._unreachable_since: float | None = None
        self._told_unreachable = False
        self._quitting = False
        self._rendered = False
        self.notifications: list[tuple[str, str]] = []  # (title, text), newest last: for tests and the log
        self.updates = UpdateChecker(
            self.paths.data / "downloads", state=self.paths.data / STATE_NAME, parent=self
        )
        self.updates.available.connect(self._on_update_available)
        self.updates.downloaded.connect(lambda path: QDesktopServices.openUrl(QUrl.fromLocalFile(path)))
        self.updates.failed.connect(lambda why: self.notify("Update not downloaded", why))
        self._build_surface()

    # -- surfaces --------------------------------------------------------------------------------------

    def _build_surface(self) -> None:
        if self.use_tray:
            self.tray = QSystemTrayIcon(icon("tray-starting"), self)
            self.menu = self.actions.build_menu()
            self.tray.setContextMenu(self.menu)
            self.tray.activated.connect(self._on_tray_activated)
        else:
            self.window = ControlWindow(self.actions)

    def _on_tray_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.show_status()

    def start(self) -> None:
        for warning in self.config_warnings + self.settings_warnings:
            self.notify("Settings repaired", warning)
        if self.tray is not None:
            self.tray.show()
        self._render()
        if self.config.consented:
            self._show_window_once()
            self.start_node()
            self._start_updates()
        else:
            self.show_wizard()

    def _start_updates(self) -> None:
        """Only once the volunteer joined (nothing is sent before), and from the server they joined:
        it names where releases are published, or that it names none (then nothing is checked)."""
        if not self.demo:
            self.updates.coordinator_url = self.config.coordinator_url
            self.updates.start()

    def _show_window_once(self) -> None:
        if self.window is None:
            return
        self.window.show()
        if not self.config.no_tray_noted:
            self.window.note.setVisible(True)
            self.notify("No tray icon here", "Learning@home shows a small window instead of a tray icon.")
            self._save_config(msgspec.structs.replace(self.config, no_tray_noted=True))

    def bring_forward(self) -> None:
        """A second copy was started: show whatever the volunteer would look for."""
        target: QWidget | None = self.wizard or self.window
        if target is None:
            self.show_status()
            return
        target.show()
        target.raise_()
        target.activateWindow()

    def notify(self, title: str, text: str) -> None:
        self.notifications.append((title, text))
        log.info("notification: %s: %s", title, text)
        if self.tray is not None and QSystemTrayIcon.supportsMessages():
            self.tray.showMessage(title, text, icon("app"), 10_000)
        elif self.window is not None:
            joint = " " if title.endswith(("!", "?", ".")) else ": "  # "Thank you! Your ...", not "you!:"
            self.window.note.setText(f"{title}{joint}{text}")
            self.window.note.setVisible(True)

    # -- first run ---------------------------------------------------------------------------------------

    def show_wizard(self) -> None:
        from .wizard import ConsentWizard

        place = token_place(self.paths.data)
        name = self.config.display_name or ("you" if self.demo else "")
        self.wizard = ConsentWizard(
            self.settings,
            self.config.coordinator_url,
            place.description,
            self._register,
            name=name,
            team=self.config.team,
        )
        if self.demo:
            self.wizard.account.autostart.setChecked(False)  # a demo never writes a login entry
        self.wizard.finished.connect(self._on_wizard_finished)
        self.wizard.show()

    def _register(self, consent: Any, done: Any) -> None:
        def finished(result: Any, error: BaseException | None) -> None:
            if error is not None:
                text = str(error) if isinstance(error, RegistrationError) else f"Registration failed: {error}"
                done(text)
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
                done(f"Your choices could not be saved: {e}")
                return
            self.settings = consent.settings
            done(None)

        self.bridge.submit(
            register(
                consent.coordinator_url,
                consent.display_name,
                consent.team,
                self.paths.data,
                invite=consent.invite,
            ),
            finished,
        )

    def _on_wizard_finished(self, accepted: int) -> None:
        wizard, self.wizard = self.wizard, None
        if wizard is None:
            return
        wizard.deleteLater()
        if not self.config.consented:  # closed without consenting: nothing ran, nothing stays
            self.quit()
            return
        self._apply_autostart(self.config.autostart)
        self._show_window_once()
        self.start_node()
        self._start_updates()

    # -- the node ----------------------------------------------------------------------------------------

    def node_args(self) -> list[str]:
        c = self.config
        args = ["--coordinator", c.coordinator_url]
        if c.display_name:
            args += ["--name", c.display_name]
        if c.team:
            args += ["--team", c.team]
        if c.token_file:
            args += ["--token-file", c.token_file]
        return args

    def start_node(self) -> None:
        if self.supervisor is None:
            self.supervisor = NodeSupervisor(
                self._node_cmd or node_command(self.node_args()),
                self.paths.logs / "node.log",
                request_shutdown=self._request_shutdown,
                node_reachable=lambda: self.link.connected,
                parent=self,
                **self._supervisor_options,
            )
            self.supervisor.state_changed.connect(self._on_supervisor)
            self.link.status_changed.connect(self._on_status)
            self.link.connected_changed.connect(lambda *_: self._render())
        self.supervisor.start()
        self.link.start()

    def _request_shutdown(self) -> None:
        def done(_result: Any, error: BaseException | None) -> None:
            if error is not None and self.supervisor is not None:
                self.supervisor.terminate_now()

        self.link.command("shutdown", done)

    def _on_supervisor(self, state: str, text: str) -> None:
        if state == "gave_up":
            self.notify("Learning@home stopped", f"{text} Log: {self.paths.logs / 'node.log'}")
        self._render()

    def _on_status(self, status: dict[str, Any]) -> None:
        self.status = status
        new_point = self.activity.add(status, time.monotonic()) is not None
        credit = status.get("credit")
        if isinstance(credit, int | float):
            crossed = milestone_crossed(self.config.credit_milestone, float(credit))
            if crossed is not None:
                self.notify("Thank you!", f"Your computer has earned {crossed:,.0f} credit for the project.")
                self._save_config(msgspec.structs.replace(self.config, credit_milestone=crossed), quiet=True)
        self._watch_unreachable(status)
        if self.status_window is not None:
            self.status_window.show_status(status, new_point)
        self._render()

    def _watch_unreachable(self, status: dict[str, Any]) -> None:
        if status.get("state") == "starting" and status.get("errors"):
            now = time.monotonic()
            self._unreachable_since = self._unreachable_since or now
            if now - self._unreachable_since >= UNREACHABLE_NOTIFY_S and not self._told_unreachable:
                self._told_unreachable = True
                self.notify(
                    "Cannot reach the project",
                    "Learning@home cannot reach the project's server and keeps trying. Nothing is lost.",
                )
        else:
            self._unreachable_since, self._told_unreachable = None, False

    def _render(self) -> None:
        sup = self.supervisor
        view = present(
            self.status if self.link.connected else None,
            sup.state if sup else "stopped",
            self._supervisor_text(),
            self.link.connected,
        )
        if view == self.view and self._rendered:
            return  # most status updates change counters, not what the tray shows
        self.view, self._rendered = view, True
        self.actions.status_line.setText(view.headline)
        self.actions.set_paused(view.paused)
        if self.tray is not None:
            self.tray.setIcon(icon(f"tray-{view.icon}"))
            self.tray.setToolTip(f"Learning@home: {view.reason}")
        if self.window is not None:
            self.window.show_view(view)
        if self.status_window is not None:
            self.status_window.show_view(view)

    def _supervisor_text(self) -> str:
        sup = self.supervisor
        if sup is None:
            return "Not started yet." if self.config.consented else "Waiting for you to join."
        return sup.text

    # -- the volunteer's commands --------------------------------------------------------------------------

    def _connect_actions(self) -> None:
        a = self.actions
        a.pause.triggered.connect(lambda: self.command("pause"))
        a.resume.triggered.connect(self.resume)
        a.snooze_hour.triggered.connect(lambda: self.command("snooze", seconds=3600))
        a.snooze_tomorrow.triggered.connect(lambda: self.command("snooze", seconds=seconds_until_tomorrow()))
        a.settings.triggered.connect(self.show_settings)
        a.status.triggered.connect(self.show_status)
        a.site.triggered.connect(self.open_site)
        a.log.triggered.connect(self.open_log)
        a.about.triggered.connect(
            lambda: self._dialogs.append(
                show_about(None, self.config.coordinator_url, self.status, self.updates.summary())
            )
        )
        a.quit.triggered.connect(self.quit)
        a.update.triggered.connect(lambda: self.updates.download())

    def _on_update_available(self, version: str, notes_url: str) -> None:
        self.actions.update.setText(f"&Update to {version}…")
        self.actions.update.setVisible(True)
        self.notify("Update available", f"Learning@home {version} is ready. Choose “Update” in the menu.")

    def command(self, cmd: str, **args: Any) -> None:
        def done(result: Any, error: BaseException | None) -> None:
            if error is not None:
                self.notify("Learning@home", f"Could not {cmd}: {getattr(error, 'message', error)}")
            elif isinstance(result, dict) and "state" in result:
                self._on_status(result)

        self.link.command(cmd, done, **args)

    def resume(self) -> None:
        if self.supervisor is not None and self.supervisor.state == "gave_up":
            self.supervisor.start()
            return
        self.command("resume")

    def site_url(self) -> str:
        base = self.config.coordinator_url
        return (
            f"{base}/contributors/{self.config.account_id}"
            if self.config.account_id
            else f"{base}/leaderboard"
        )

    def open_site(self) -> None:
        QDesktopServices.openUrl(QUrl(self.site_url()))

    def open_log(self) -> None:
        path = self.paths.logs / "node.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))

    def show_status(self) -> None:
        if self.status_window is None:
            from .status_window import StatusWindow

            self.status_window = StatusWindow(self.activity)
            self.status_window.show_view(self.view)
            if self.status is not None:
                self.status_window.show_status(self.status)
        self.status_window.show()
        self.status_window.redraw()
        self.status_window.raise_()
        if self._credit_timer is None:
            self._credit_timer = QTimer(self)
            self._credit_timer.setInterval(int(CREDIT_REFRESH_S * 1000))
            self._credit_timer.timeout.connect(self.ask_credit)
            self._credit_timer.start()
        self.ask_credit()

    def ask_credit(self) -> None:
        """While the status window is open, have the node read the account's credit from the coordinator
        now, not at its once-a-minute pace. The node asks, not the app: it holds the token and refreshes
        it, and a refresh revokes the old token, so a second user of it could log the node out. The
        reply comes at once; the new credit arrives with the status stream."""
        window = self.status_window
        if window is not None and window.isVisible() and self.link.connected:
            self.link.command("refresh_credit")

    def show_settings(self) -> None:
        from .settings_window import SettingsWindow

        limits = self.status.get("limits") if self.status else None
        current = self.settings
        if isinstance(limits, dict):
            with contextlib.suppress(msgspec.ValidationError):
                current = msgspec.convert(limits, Settings)
        if self.settings_window is None:
            self.settings_window = SettingsWindow(current, self.config.autostart, self._apply_settings)
        else:
            self.settings_window.load(current, self.config.autostart)
        self.settings_window.show()
        self.settings_window.raise_()

    def _apply_settings(self, limits: dict[str, Any], autostart_on: bool, done: Any) -> None:
        problems = []
        if autostart_on != self.config.autostart:
            if not self._apply_autostart(autostart_on):
                problems.append("The login entry could not be changed.")
            else:
                problems += self._save_config(msgspec.structs.replace(self.config, autostart=autostart_on))

        def finished(result: Any, error: BaseException | None) -> None:
            if error is None:
                self.settings = msgspec.convert(result, Settings)
                done(" ".join(problems) or None)
                return
            if getattr(error, "code", "") == "not_running":  # no node now: it reads the file when it starts
                try:
                    settings = msgspec.convert({**msgspec.to_builtins(self.settings), **limits}, Settings)
                    save_settings(settings, self.paths.settings)
                    self.settings = settings
                    done("Saved. The engine is not running; it will use them when it starts.")
                except (SettingsError, msgspec.ValidationError) as e:
                    done(str(e))
                return
            done(getattr(error, "message", str(error)))

        self.link.command("set_limits", finished, limits=limits)

    def _apply_autostart(self, enabled: bool) -> bool:
        try:
            autostart.set_enabled(enabled)
            return True
        except OSError as e:
            self.notify("Start at login", f"Could not change the login entry: {e}")
            return False

    def _save_config(self, config: AppConfig, quiet: bool = False) -> list[str]:
        self.config = config
        try:
            save_config(config, self.paths.config)
            return []
        except ConfigError as e:
            if not quiet:
                self.notify("Settings not saved", str(e))
            return [str(e)]

    # -- quitting ----------------------------------------------------------------------------------------

    def quit(self) -> None:
        """Stop the node cleanly (checkpoints written), then leave; bounded even if the node hangs."""
        if self._quitting:
            return
        self._quitting = True
        for w in (self.wizard, self.window, self.status_window, self.settings_window, *self._dialogs):
            if w is not None:
                w.hide()
        QTimer.singleShot(40_000, self._finish)  # the supervisor's own bound is shorter; this is the last one
        if self.supervisor is not None:
            self.supervisor.stop(self._finish)
        else:
            self._finish()

    def _finish(self) -> None:
        self.link.stop()
        if self.tray is not None:
            self.tray.hide()
        self.bridge.close()
        self.qapp.quit()


def seconds_until_tomorrow(now: datetime | None = None) -> float:
    now = now or datetime.now()
    morning = (now + timedelta(days=1)).replace(hour=TOMORROW_HOUR, minute=0, second=0, microsecond=0)
    return (morning - now).total_seconds()
