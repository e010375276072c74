"""The tray as a volunteer meets it: the real app process on a real X screen with a tray host. Its icon
appears, a real right-click opens its menu, Pause changes the node's state and the icon, Quit ends
the app and its node. Without a tray host the app shows its small window instead.

The menu screenshot is kept in docs/screenshots/ for the README.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QRect
from PySide6.QtGui import QColor, QImage

from tests.ui.xscreen import WindowInfo, XScreen

from .conftest import Coordinator
from .helpers import consented, node_state

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def wait(what: str, probe: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def icon_colour(screen: XScreen, icon: WindowInfo, path: Path) -> QColor:
    """The icon's dominant colour on screen (the average of its opaque middle)."""
    screen.screenshot(path)
    image = QImage(str(path))
    r = g = b = n = 0
    for x in range(icon.x + icon.width // 4, icon.x + 3 * icon.width // 4):
        for y in range(icon.y + icon.height // 4, icon.y + 3 * icon.height // 4):
            c = image.pixelColor(x, y)
            r, g, b, n = r + c.red(), g + c.green(), b + c.blue(), n + 1
    return QColor(r // n, g // n, b // n)


def looks_green(c: QColor) -> bool:
    """The contributing icon is a saturated green under its white glyph; the others are grey."""
    return 100 <= c.hsvHue() <= 180 and c.hsvSaturation() > 60


def test_tray_icon_menu_pause_and_quit(
    app_env: Path,
    coordinator: Coordinator,
    xscreen: XScreen,
    tmp_path: Path,
) -> None:
    consented(coordinator.url)
    app = xscreen.popen(
        [sys.executable, "-m", "lah", "app"], env={**xscreen.env, "LAH_COLOR_SCHEME": "light"}
    )
    icon = xscreen.wait_for_tray_icon(timeout=30)
    tray = next(i for i in xscreen.tray_icons())
    wait("the node to contribute", lambda: node_state() == "running", 90)
    # The next status event repaints the icon; on a loaded machine that can take more than a second or two.
    shot = tmp_path / "a.png"
    wait("the icon to turn green", lambda: looks_green(icon_colour(xscreen, tray, shot)), 20)

    xscreen.click(*icon, button=3)
    menu = xscreen.wait_for_menu(timeout=10)
    shot = xscreen.screenshot(tmp_path / "menu.png")
    image = QImage(str(shot))
    left = max(0, menu.x - 40)
    region = QRect(left, 0, min(image.width() - left, menu.width + 80), menu.y + menu.height + 20)
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert image.copy(region).save(str(SHOTS / "tray-menu.png"))
    xscreen.key("Down", "Return")  # the first enabled item: Pause (the status line is not selectable)
    xscreen.wait_for_no_menu(timeout=10)
    wait("the node to pause", lambda: node_state() == "paused", 15)
    time.sleep(1.0)
    assert not looks_green(icon_colour(xscreen, tray, tmp_path / "b.png"))

    xscreen.click(*icon, button=3)
    xscreen.wait_for_menu(timeout=10)
    xscreen.key("Up", "Return")  # wraps to the last item: Quit
    assert app.wait(timeout=45) == 0
    wait("the node to be gone", lambda: node_state() is None, 15)
    log = app_env / "state" / "learning-at-home" / "log" / "node.log"
    assert log.is_file() or list(app_env.rglob("node.log"))


def test_without_a_tray_the_window_stands_in_and_says_why(
    app_env: Path,
    coordinator: Coordinator,
    xscreen_no_tray: XScreen,
) -> None:
    consented(coordinator.url)
    app = xscreen_no_tray.popen([sys.executable, "-m", "lah", "app"])
    try:
        window = xscreen_no_tray.wait_for_window("Learning@home", timeout=30)
        assert window.width > 100 and window.height > 80
        wait("the node to contribute", lambda: node_state() == "running", 90)
        assert (
            (app_env / "config" / "learning-at-home" / "app.toml").read_text().count("no_tray_noted = true")
        )
    finally:
        app.terminate()
        try:
            app.wait(timeout=45)
        except subprocess.TimeoutExpired:
            app.kill()
