"""The tray app against real parts: a real coordinator on 127.0.0.1 (in a loop thread of the test
process), a real ``lah node`` child process, real Qt widgets (offscreen unless a test starts an X screen).

Every test gets its own user folders (XDG_*), so config, settings, tokens, logs and the control file
never touch the developer's own, and nothing leaves loopback (``LAH_HOST_ADDRESSES``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes the QApplication

from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.server.app import RunningCoordinator, start_full
from engine.moe import LoopThread
from lah.demo_app import user_folders
from tests.ui.conftest import xscreen, xscreen_no_tray  # noqa: F401 (the real X screen's fixtures)

EXP = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2], hyperparams={"d_model": 16, "hidden": 32})


@dataclass
class Coordinator:
    running: RunningCoordinator
    loop: LoopThread

    @property
    def url(self) -> str:
        return self.running.url

    def stop(self) -> None:
        self.loop.run(self.running.stop(), 15)


@pytest.fixture
def app_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Private user folders for the app and its node, loopback only, no keyring (the file fallback)."""
    for var, path in user_folders(tmp_path).items():
        monkeypatch.setenv(var, path)
    monkeypatch.setenv("LAH_HOST_ADDRESSES", "127.0.0.1")
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    return tmp_path


def start_coordinator(tmp_path: Path, port: int = 0, **overrides: Any) -> Coordinator:
    tmp_path.mkdir(parents=True, exist_ok=True)
    loop = LoopThread("test-coordinator")
    config = CoordinatorConfig(
        port=port,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'coordinator.sqlite3'}",
        token_key_path=str(tmp_path / "token.key"),
        experiments=[EXP],
        verify_workers=0,
    )
    config = msgspec.structs.replace(config, **overrides)
    return Coordinator(loop.run(start_full(config), 30), loop)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    c = start_coordinator(tmp_path)
    yield c
    c.stop()
    c.loop.close()


@pytest.fixture
def wait_until(qtbot: object) -> Callable[..., None]:
    """``wait_until(predicate, timeout_s, what)``: process Qt events until it holds, else fail saying what."""
    from pytestqt.qtbot import QtBot

    assert isinstance(qtbot, QtBot)

    def wait(predicate: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> None:
        try:
            qtbot.waitUntil(lambda: bool(predicate()), timeout=int(timeout * 1000))
        except AssertionError:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}") from None

    return wait


@pytest.fixture
def make_controller(qtbot: object) -> Iterator[Callable[..., object]]:
    """Build AppControllers that are always torn down: Quit (clean node stop), else the node is killed."""
    from PySide6.QtWidgets import QApplication

    from app.qt.controller import AppController

    made: list[AppController] = []

    def make(**options: object) -> AppController:
        qapp = QApplication.instance()
        assert isinstance(qapp, QApplication)
        controller = AppController(qapp, **options)  # type: ignore[arg-type]
        made.append(controller)
        return controller

    yield make
    for controller in made:
        if controller.supervisor is not None:
            controller.supervisor.kill()  # and no restart later, in another test's folders
        controller.link.stop()
        controller.bridge.close()
        for w in (controller.window, controller.status_window, controller.settings_window, controller.wizard):
            if w is not None:
                w.close()
