"""What goes wrong on volunteers' machines, each against the real parts: a node that crashes at start,
a stale control file, a coordinator that is down during first run and later, a locked keyring,
hand-edited settings, a full disk, and a second copy of the app."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWizard

from app.core import notices
from app.core.config import AppConfig, load_config, save_config
from app.core.errors import ConfigError
from app.core.paths import AppPaths
from app.core.registration import register, token_place
from app.qt.controller import AppController
from app.qt.single_instance import SingleInstance
from engine.account import FileTokenStore
from engine.control import ConnectionInfo, default_connection_path
from engine.control.protocol import data_dir
from engine.resources import load_settings

from .conftest import Coordinator, start_coordinator
from .helpers import consented, fill, free_port, tiny_disk

Make = Callable[..., AppController]
Wait = Callable[..., None]


def test_a_node_that_crashes_at_start_is_retried_then_given_up_with_the_log_named(
    app_env: Path, coordinator: Coordinator, make_controller: Make, wait_until: Wait
) -> None:
    consented(coordinator.url)
    key = data_dir() / "identity.key"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("not a key")  # a damaged identity: the real node dies with a clear error at start
    c = make_controller(use_tray=False, supervisor_options={"backoff_s": (0.2, 0.4), "give_up_after": 3})
    c.start()
    wait_until(lambda: c.supervisor is not None and c.supervisor.state == "gave_up", 90, "giving up")
    assert c.supervisor is not None and c.supervisor.starts == 3
    assert c.view.icon == "error" and "3 times" in c.view.reason
    title, text = c.notifications[-1]
    assert title == "Learning@home stopped" and str(c.paths.logs / "node.log") in text
    assert "is not a PEM private key" in (c.paths.logs / "node.log").read_text()
    key.unlink()  # the volunteer (or support) mends it; Resume tries again
    c.resume()
    wait_until(lambda: (c.status or {}).get("state") == "running", 90, "running after Resume")


def test_a_stale_control_file_does_not_stop_the_app_from_finding_its_node(
    app_env: Path, coordinator: Coordinator, make_controller: Make, wait_until: Wait
) -> None:
    consented(coordinator.url)
    stale = ConnectionInfo("127.0.0.1", free_port(), "0" * 64, 999_999)  # a node that died long ago
    stale.write(default_connection_path())
    c = make_controller(use_tray=False)
    c.start()
    wait_until(lambda: (c.status or {}).get("state") == "running", 90, "the new node")
    assert ConnectionInfo.read(default_connection_path()).secret != stale.secret


def test_wrong_secret_is_refused_and_the_link_recovers_when_the_file_is_right(
    app_env: Path, coordinator: Coordinator, make_controller: Make, wait_until: Wait
) -> None:
    consented(coordinator.url)
    c = make_controller(use_tray=False)
    c.start()
    wait_until(lambda: (c.status or {}).get("state") == "running", 90, "running")
    path = default_connection_path()
    good = ConnectionInfo.read(path)
    reasons: list[str] = []
    c.link.connected_changed.connect(lambda ok, why: reasons.append(why) if not ok else None)
    c.actions.pause.trigger()  # on the command connection, authenticated before the file goes bad
    wait_until(lambda: (c.status or {}).get("state") == "paused", 10, "paused")
    ConnectionInfo(good.host, good.port, "f" * 64, good.pid).write(path)
    c.bridge.submit(_drop_stream(c))
    wait_until(lambda: any("secret" in r for r in reasons), 15, "the refusal")
    assert c.view.icon == "starting"
    good.write(path)
    wait_until(lambda: c.link.connected and (c.status or {}).get("state") == "paused", 20, "reconnected")


async def _drop_stream(c: AppController) -> None:
    """Make the status stream reconnect now (as after a node restart) instead of at its heartbeat."""
    for task in asyncio.all_tasks():
        if task.get_coro().__qualname__.startswith("NodeLink._follow"):  # type: ignore[union-attr]
            task.cancel()
    c.link._tasks = []
    c.link.start()


def test_first_run_with_the_coordinator_down_says_so_and_retries(
    qtbot: Any, app_env: Path, tmp_path: Path, make_controller: Make, wait_until: Wait
) -> None:
    port = free_port()
    c = make_controller(coordinator=f"http://127.0.0.1:{port}", use_tray=False)
    c.start()
    wiz = c.wizard
    assert wiz is not None
    for _ in range(3):
        wiz.next()
    qtbot.keyClicks(wiz.account.name, "Cy") if not wiz.account.name.text() else None
    while wiz.currentPage() is not wiz.confirm:
        wiz.next()
    finish = wiz.button(QWizard.WizardButton.FinishButton)
    qtbot.mouseClick(finish, Qt.MouseButton.LeftButton)
    wait_until(lambda: "try again" in wiz.confirm.progress.text(), 30, "the error on the page")
    assert "cannot be reached" in wiz.confirm.progress.text()
    assert wiz.isVisible() and not c.config.consented and c.supervisor is None and finish.isEnabled()
    late = start_coordinator(tmp_path / "late", port=port)
    try:
        qtbot.mouseClick(finish, Qt.MouseButton.LeftButton)
        wait_until(lambda: c.config.consented and c.supervisor is not None, 30, "the retry to work")
    finally:
        late.stop()
        late.loop.close()


def test_coordinator_down_later_is_shown_and_told_once_then_recovers(
    app_env: Path, tmp_path: Path, make_controller: Make, wait_until: Wait, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notices, "UNREACHABLE_NOTIFY_S", 1.0)
    port = free_port()
    consented(f"http://127.0.0.1:{port}")
    c = make_controller(use_tray=False)
    c.start()
    wait_until(lambda: c.view.headline == "Cannot reach the project", 60, "the unreachable state")
    assert c.view.icon == "error" and "unreachable" in c.view.reason
    wait_until(lambda: any(t == "Cannot reach the project" for t, _ in c.notifications), 30, "the notice")
    late = start_coordinator(tmp_path / "late", port=port)
    try:
        wait_until(lambda: (c.status or {}).get("state") == "running", 90, "joining once it is back")
        assert sum(t == "Cannot reach the project" for t, _ in c.notifications) == 1
    finally:
        c.quit()
        wait_until(lambda: c.supervisor is not None and c.supervisor.state == "stopped", 40, "stopped")
        late.stop()
        late.loop.close()


def test_a_locked_keyring_falls_back_to_the_private_file_and_says_so(
    app_env: Path, coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2]))
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "tests.app.locked_keyring.LockedKeyring")
    import keyring.core

    keyring.core.set_keyring(keyring.core.load_keyring("tests.app.locked_keyring.LockedKeyring"))
    try:
        assert "keyring" in token_place(data_dir()).description  # a keyring is there ...
        creds, place = asyncio.run(register(coordinator.url, "Dee", "", data_dir()))
    finally:
        keyring.core.set_keyring(keyring.core.load_keyring("keyring.backends.fail.Keyring"))
    assert place.file is not None and "refused" in place.description  # ... but locked: said plainly
    stored = FileTokenStore(place.file).get(coordinator.url)
    assert stored is not None and json.loads(stored)["account_id"] == creds.account_id


def test_no_keyring_is_named_on_the_wizard_page(app_env: Path, make_controller: Make) -> None:
    c = make_controller(coordinator="http://127.0.0.1:9", use_tray=False)
    c.start()
    assert c.wizard is not None
    text = c.wizard.account.findChild(type(c.wizard.confirm.progress), "tokenPlace").text()
    assert "no keyring" in text and "token.json" in text


def test_hand_edited_settings_are_repaired_and_each_field_named(
    app_env: Path, coordinator: Coordinator, make_controller: Make
) -> None:
    paths = consented(coordinator.url)
    paths.settings.write_text("cpu_max_percent = 400\nidle_after_s = 'soon'\nuse_gpu = false\n")
    paths.config.write_text("consented = true\ncoordinator_url = 'ftp://nope'\ndisplay_name = 'Bo'\n")
    c = make_controller(use_tray=False, node_cmd=[sys.executable, "-c", "import time; time.sleep(30)"])
    c.start()
    said = " ".join(text for _, text in c.notifications)
    assert "'cpu_max_percent' = 400" in said and "'idle_after_s'" in said and "'coordinator_url'" in said
    assert c.settings.cpu_max_percent == 50 and c.settings.use_gpu is False  # the rest kept
    assert load_settings(paths.settings)[0].cpu_max_percent == 50  # written back repaired ...
    assert list(paths.settings.parent.glob("settings.toml.bad-*"))  # ... the original kept
    assert load_config(paths.config)[0].display_name == "Bo"


def test_limits_are_checked_as_the_volunteer_types(qtbot: Any) -> None:
    from app.qt.limits_form import LimitsForm

    form = LimitsForm()
    qtbot.addWidget(form)
    form.widget("cpu_max_percent").setValue(400)
    assert form.widget("cpu_max_percent").value() == 100  # the box cannot go past the model's bound
    qtbot.keyClicks(form.widget("sat"), ", 25:00-26:00")
    assert not form.valid and "Sat" in form.error_label.text() and "does not exist" in form.error_label.text()
    form.widget("sat").setText("09:00-17:00")
    assert form.valid and form.values()["schedule"]["sat"] == ["09:00-17:00"]


def test_a_full_disk_loses_nothing_and_is_said(app_env: Path) -> None:
    paths = AppPaths.default()
    with tiny_disk(paths.config.parent):
        save_config(AppConfig(display_name="Eve"), paths.config)
        fill(paths.config.parent)
        with pytest.raises(ConfigError, match="No space left"):
            save_config(AppConfig(display_name="Fay"), paths.config)
        assert load_config(paths.config)[0].display_name == "Eve"  # the previous file is whole
        assert not [p for p in paths.config.parent.iterdir() if p.name.startswith(".app.toml")]


def test_a_second_copy_brings_the_first_forward_and_exits(app_env: Path, qtbot: Any) -> None:
    first = SingleInstance(str(AppPaths.default().config.parent))
    assert first.claim()
    try:
        with qtbot.waitSignal(first.activated, timeout=30_000):
            second = subprocess.Popen(
                [sys.executable, "-m", "lah", "app"],
                env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
                stderr=subprocess.PIPE,
                text=True,
            )
            out = ""
            while second.poll() is None:
                qtbot.wait(50)
        assert second.wait(30) == 0
        out = second.stderr.read() if second.stderr else ""
        assert "already running" in out
    finally:
        first.close()
    again = SingleInstance(str(AppPaths.default().config.parent))  # a crashed copy's socket is reclaimed
    assert again.claim()
    again.close()


def test_a_node_whose_app_is_gone_stops_cleanly_by_itself(app_env: Path, coordinator: Coordinator) -> None:
    consented(coordinator.url)
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(8)"])
    node = subprocess.Popen(
        [sys.executable, "-m", "lah", "node", "--coordinator", coordinator.url, "--name", "Gus"],
        env={**os.environ, "LAH_PARENT_PID": str(parent.pid)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        parent.wait(30)  # the "app" ends without a word (as a crash would)
        assert node.wait(60) == 0
        out = node.stdout.read() if node.stdout else ""
        assert "control at" in out and f"(pid {parent.pid}) is gone; stopping" in out
        assert not default_connection_path().exists()  # it cleaned up as on any clean stop
    finally:
        for proc in (parent, node):
            if proc.poll() is None:
                proc.kill()
