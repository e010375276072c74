"""First run to Quit against a real coordinator and a real node process: consent, registration, the
node started and followed, Pause/Resume through the control API, live limits, a clean Quit."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QWizard

from app.core.paths import AppPaths
from app.qt.controller import AppController
from engine.resources import load_settings

from .conftest import Coordinator


def go_through_wizard(qtbot: Any, c: AppController, name: str) -> None:
    wiz = c.wizard
    assert wiz is not None
    assert wiz.currentPage() is wiz.welcome
    wiz.next()
    assert wiz.currentPage() is wiz.limits
    away_only = wiz.limits.form.widget("only_when_idle")
    wiz.limits.scroller.ensureWidgetVisible(away_only)  # scrolled to, as a person would
    on_box = QPoint(8, away_only.height() // 2)  # the box itself: a click right of the text hits nothing
    qtbot.mouseClick(away_only, Qt.MouseButton.LeftButton, pos=on_box)
    assert not away_only.isChecked()
    wiz.next()
    assert wiz.currentPage() is wiz.account
    assert not wiz.account.isComplete()  # no name yet
    qtbot.keyClicks(wiz.account.name, name)
    assert wiz.account.isComplete()
    wiz.account.autostart.setChecked(True)
    wiz.next()
    assert wiz.currentPage() is wiz.confirm
    assert "Nothing has run" in wiz.confirm.subTitle()


def test_consent_then_contributing_pause_resume_limits_and_quit(
    qtbot: Any,
    app_env: Path,
    coordinator: Coordinator,
    make_controller: Callable[..., AppController],
    wait_until: Callable[..., None],
) -> None:
    c = make_controller(coordinator=coordinator.url, use_tray=False)
    c.start()
    assert c.supervisor is None and c.wizard is not None  # nothing runs before consent
    go_through_wizard(qtbot, c, "Ada")
    assert c.supervisor is None and not c.paths.config.exists()  # ... and nothing was sent or saved
    finish = c.wizard.button(QWizard.WizardButton.FinishButton)
    assert finish.text() == "Start contributing"
    qtbot.mouseClick(finish, Qt.MouseButton.LeftButton)
    wait_until(lambda: c.config.consented, 20, "registration")
    assert c.config.account_id > 0 and c.config.display_name == "Ada"
    # no keyring here: the token is in the node's private file, and the node is told where
    token_file = Path(c.config.token_file)
    assert token_file.is_file() and token_file.stat().st_mode & 0o777 == 0o600
    assert coordinator.url in json.loads(token_file.read_text())
    assert "--token-file" in c.node_args()
    assert load_settings(c.paths.settings)[0].only_when_idle is False
    autostart_entry = app_env / "config" / "autostart" / "learning-at-home.desktop"
    assert autostart_entry.is_file() and "Exec=" in autostart_entry.read_text()

    wait_until(lambda: c.status is not None and c.status.get("state") == "running", 90, "the node to run")
    assert c.view.icon == "contributing" and c.window is not None and c.window.isVisible()
    assert c.status is not None and c.status["experts"]

    c.actions.pause.trigger()
    wait_until(lambda: c.status is not None and c.status["state"] == "paused", 10, "paused")
    assert c.view.icon == "paused" and c.actions.resume.isVisible() and not c.actions.pause.isVisible()
    c.actions.resume.trigger()
    wait_until(lambda: c.status is not None and c.status["state"] == "running", 10, "running again")

    c.show_settings()
    form = c.settings_window.form
    form.widget("cpu_max_percent").setValue(35)
    c.settings_window.apply()
    wait_until(lambda: "in force" in c.settings_window.message.text(), 10, "limits applied")
    wait_until(lambda: (c.status or {}).get("limits", {}).get("cpu_max_percent") == 35, 10, "live limits")
    assert load_settings(c.paths.settings)[0].cpu_max_percent == 35

    c.show_status()
    assert c.status_window.fields["experts"].text().startswith(str(len(c.status["experts"])))

    pid = c.supervisor.pid if c.supervisor else None
    assert pid
    c.quit()
    wait_until(lambda: c.supervisor is not None and c.supervisor.state == "stopped", 40, "a clean stop")
    assert c.supervisor.last_exit == (0, "normal")  # shut down through the control API, not killed
    node_log = (AppPaths.default().logs / "node.log").read_text()
    assert "control at" in node_log


def test_an_invited_volunteer_joins_with_the_code_and_a_wrong_code_is_said_plainly(
    qtbot: Any,
    app_env: Path,
    tmp_path: Path,
    make_controller: Callable[..., AppController],
    wait_until: Callable[..., None],
) -> None:
    """A project that admits only invited names: the code goes on the account page; a wrong one is named
    and nothing is saved, the right one registers."""
    from .conftest import start_coordinator

    coordinator = start_coordinator(tmp_path / "invite-only", allowlist_mode=True)
    try:
        code, _ = coordinator.loop.run(coordinator.running.services.accounts.invite("Ivy", by=None), 15)
        c = make_controller(coordinator=coordinator.url, use_tray=False)
        c.start()
        go_through_wizard(qtbot, c, "Ivy")
        assert c.wizard is not None
        c.wizard.back()
        assert c.wizard.currentPage() is c.wizard.account
        qtbot.keyClicks(c.wizard.account.invite, "not-the-code")
        c.wizard.next()
        finish = c.wizard.button(QWizard.WizardButton.FinishButton)
        qtbot.mouseClick(finish, Qt.MouseButton.LeftButton)
        progress = c.wizard.confirm.progress
        wait_until(lambda: "invitation code" in progress.text(), 20, "the refusal to be shown")
        assert "admits only the people it invited" in progress.text()
        assert not c.config.consented and not c.paths.config.exists() and c.supervisor is None
        c.wizard.back()
        c.wizard.account.invite.setText(code)
        c.wizard.next()
        qtbot.mouseClick(finish, Qt.MouseButton.LeftButton)
        wait_until(lambda: c.config.consented, 20, "registration with the code")
        assert c.config.display_name == "Ivy" and c.config.account_id > 0
    finally:
        coordinator.stop()
        coordinator.loop.close()
