"""Under Wayland only the desktop knows how long the user has been away: the app asks its D-Bus idle
service. Here a real dbus-daemon (a private session bus) and a real service answer the app's reader."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def session_bus(tmp_path: Path) -> dict[str, str]:
    daemon = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--print-address=1", f"--address=unix:dir={tmp_path}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert daemon.stdout is not None
    address = daemon.stdout.readline().strip()
    assert address.startswith("unix:"), address
    yield {"DBUS_SESSION_BUS_ADDRESS": address}
    daemon.terminate()
    daemon.wait(10)


def read_idle(env: dict[str, str]) -> str:
    code = (
        "from PySide6.QtCore import QCoreApplication; app = QCoreApplication([]);"
        "from app.qt.idle import session_idle_reader; read, name = session_idle_reader();"
        "r = read(); print(name, r.seconds, r.reason)"
    )
    env = {**os.environ, **env, "WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "wayland"}
    env.pop("DISPLAY", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_wayland_idle_time_comes_from_the_desktops_dbus_service(session_bus: dict[str, str]) -> None:
    assert read_idle(session_bus).startswith("app:dbus None the desktop offers no idle-time service")
    service = subprocess.Popen(
        [sys.executable, str(HERE / "idle_service.py"), "123456"],
        env={**os.environ, **session_bus},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.stdout is not None and service.stdout.readline().strip() == "ready"
        assert read_idle(session_bus) == "app:dbus 123.456"
    finally:
        service.terminate()
        service.wait(10)
