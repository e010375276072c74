"""AppController: the app's Qt side, wired to its Lifecycle (``app.core.lifecycle``).

It owns the QObjects: the tray or the window that stands in for it, the other windows, the node's
process (``NodeSupervisor``), the control link (``NodeLink``), the loop thread (``Bridge``), the update
check and the timers. Their events go to the Lifecycle, which decides what happens; the Lifecycle asks
back through the ``Host`` methods below, each a few lines of Qt. No decision is taken here, so the
app's states and transitions are tested without a screen.

Everything here runs on the GUI thread and only for moments: network and disk-heavy work goes through
``Bridge`` (registration, control commands) or QProcess (the node), and their answers come back as
signals. The app never imports torch: what it knows of the engine comes through the control API.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import QObject, QTimer, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QApplication, QSystemTrayIcon, QWidget

from app.core.activity import Activity
from app.core.config import AppConfig
from app.core.consent import FirstRun
from app.core.host import Done
from app.core.lifecycle import Lifecycle
from app.core.notices import seconds_until_tomorrow
from app.core.paths import AppPaths
from app.core.presentation import View
from app.core.update_policy import STATE_NAME
from engine.resources import Settings

from .about import show_about
from .actions import Actions
from .assets import icon
from .bridge import Bridge
from .control_window import ControlWindow
from .idle import session_idle_reader
from .node_link import NodeLink
from .supervisor import NodeSupervisor, node_command
from .update_check import UpdateChecker

log = logging.getLogger(__name__)

CREDIT_REFRESH_S = 30.0  # while the status window is open: the node reads the credit this often
QUIT_BOUND_MS = 40_000  # the supervisor's own bound is shorter; this is the last one


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
        self.lifecycle = Lifecycle(self, paths or AppPaths.default(), coordinator=coordinator, demo=demo)
        self.bridge = Bridge(self)
        reader, source = session_idle_reader()
        self.link = NodeLink(self.bridge, idle_reader=lambda: (reader(), source), parent=self)
        self._node_cmd = node_cmd
        self._supervisor_options = supervisor_options or {}
        self.supervisor: NodeSupervisor | None = None
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
        self.notifications: list[tuple[str, str]] = []  # (title, text), newest last: for tests and the log
        self.updates = UpdateChecker(
            self.paths.data / "downloads", state=self.paths.data / STATE_NAME, parent=self
        )
        self.updates.available.connect(self._on_update_available)
        self.updates.downloaded.connect(lambda path: QDesktopServices.openUrl(QUrl.fromLocalFile(path)))
        self.updates.failed.connect(lambda why: self.notify("Update not downloaded", why))
        self._build_surface()

    # -- the lifecycle's state, read by the windows and tests ----------------------------------------------

    @property
    def paths(self) -> AppPaths:
        return self.lifecycle.paths

    @property
    def config(self) -> AppConfig:
        return self.lifecycle.config

    @property
    def settings(self) -> Settings:
        return self.lifecycle.settings

    @property
    def status(self) -> dict[str, Any] | None:
        return self.lifecycle.status

    @property
    def view(self) -> View:
        return self.lifecycle.view

    @property
    def activity(self) -> Activity:
        return self.lifecycle.activity

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
        self.lifecycle.start()

    def bring_forward(self) -> None:
        """A second copy was started: show whatever the volunteer would look for."""
        target: QWidget | None = self.wizard or self.window
        if target is None:
            self.show_status()
            return
        target.show()
        target.raise_()
        target.activateWindow()

    # -- Host: what the lifecycle asks of the desktop ------------------------------------------------------

    def notify(self, title: str, text: str) -> None:
        self.notifications.append((title, text))
        log.info("notification: %s: %s", title, text)
        if self.tray is not None and QSystemTrayIcon.supportsMessages():
            self.tray.showMessage(title, text, icon("app"), 10_000)
        elif self.window is not None:
            joint = " " if title.endswith(("!", "?", ".")) else ": "  # "Thank you! Your ...", not "you!:"
            self.window.note.setText(f"{title}{joint}{text}")
            self.window.note.setVisible(True)

    def show_tray(self) -> None:
        if self.tray is not None:
            self.tray.show()

    def render(self, view: View) -> None:
        self.actions.status_line.setText(view.headline)
        self.actions.set_paused(view.paused)
        if self.tray is not None:
            self.tray.setIcon(icon(f"tray-{view.icon}"))
            self.tray.setToolTip(f"Learning@home: {view.reason}")
        if self.window is not None:
            self.window.show_view(view)
        if self.status_window is not None:
            self.status_window.show_view(view)

    def show_wizard(self, first_run: FirstRun) -> None:
        from .wizard import ConsentWizard

        self.wizard = ConsentWizard(
            first_run.settings,
            first_run.coordinator_url,
            first_run.token_place,
            self.lifecycle.register,
            name=first_run.name,
            team=first_run.team,
        )
        if not first_run.autostart:
            self.wizard.account.autostart.setChecked(False)
        self.wizard.finished.connect(self._on_wizard_finished)
        self.wizard.show()

    def _on_wizard_finished(self, _accepted: int) -> None:
        wizard, self.wizard = self.wizard, None
        if wizard is None:
            return
        wizard.deleteLater()
        self.lifecycle.wizard_closed()

    def show_window(self) -> bool:
        if self.window is None:
            return False
        self.window.show()
        return True

    def start_node(self) -> None:
        if self.supervisor is None:
            self.supervisor = NodeSupervisor(
                self._node_cmd or node_command(self.lifecycle.node_args()),
                self.paths.logs / "node.log",
                request_shutdown=self._request_shutdown,
                node_reachable=lambda: self.link.connected,
                parent=self,
                **self._supervisor_options,
            )
            self.supervisor.state_changed.connect(self.lifecycle.node_changed)
            self.link.status_changed.connect(self.lifecycle.status_received)
            self.link.connected_changed.connect(lambda *_: self.lifecycle.link_changed())
        self.supervisor.start()
        self.link.start()

    def restart_node(self) -> None:
        if self.supervisor is not None:
            self.supervisor.start()

    def _request_shutdown(self) -> None:
        def done(_result: Any, error: BaseException | None) -> None:
            if error is not None and self.supervisor is not None:
                self.supervisor.terminate_now()

        self.link.command("shutdown", done)

    def start_updates(self, coordinator_url: str) -> None:
        self.updates.coordinator_url = coordinator_url
        self.updates.start()

    def run(self, work: Coroutine[Any, Any, Any], done: Done) -> None:
        self.bridge.submit(work, done)

    def send(self, cmd: str, done: Done | None, **args: Any) -> None:
        self.link.command(cmd, done, **args)

    def show_node_status(self, status: dict[str, Any], new_point: bool) -> None:
        if self.status_window is not None:
            self.status_window.show_status(status, new_point)

    def node_state(self) -> tuple[str, str] | None:
        sup = self.supervisor
        return (sup.state, sup.text) if sup is not None else None

    def node_connected(self) -> bool:
        return self.link.connected

    def wind_down(self, on_stopped: Callable[[], None]) -> None:
        for w in (self.wizard, self.window, self.status_window, self.settings_window, *self._dialogs):
            if w is not None:
                w.hide()
        QTimer.singleShot(QUIT_BOUND_MS, on_stopped)
        if self.supervisor is not None:
            self.supervisor.stop(on_stopped)
        else:
            on_stopped()

    def finish(self) -> None:
        self.link.stop()
        if self.tray is not None:
            self.tray.hide()
        self.bridge.close()
        self.qapp.quit()

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
        self.lifecycle.command(cmd, **args)

    def resume(self) -> None:
        self.lifecycle.resume()

    def node_args(self) -> list[str]:
        return self.lifecycle.node_args()

    def site_url(self) -> str:
        return self.lifecycle.site_url()

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

        current = self.lifecycle.current_settings()
        if self.settings_window is None:
            apply = self.lifecycle.apply_settings
            self.settings_window = SettingsWindow(current, self.config.autostart, apply)
        else:
            self.settings_window.load(current, self.config.autostart)
        self.settings_window.show()
        self.settings_window.raise_()

    # -- quitting ----------------------------------------------------------------------------------------

    def quit(self) -> None:
        """Stop the node cleanly (checkpoints written), then leave; bounded even if the node hangs."""
        self.lifecycle.quit()
