"""The X-screen harness proved on a tiny real tray app (tray_probe.py), as a child process.

What these tests pin down about Qt's tray under Xvfb + trayer (PySide6, XEmbed tray, no D-Bus):
- the icon docks as an _XEMBED_INFO window inside trayer's panel, found via the window tree;
- right-click opens the context menu as an override-redirect POPUP_MENU window at the pointer;
  its items can be clicked by position (equal-height items) or driven by Down/Return; a second
  right-press within Qt's double-click interval (400 ms) opens nothing, hence XScreen.click's spacing;
- left-click emits activated(Trigger) and opens no menu; a double click emits Trigger then
  DoubleClick; middle-click emits MiddleClick;
- showMessage without a notification daemon falls back to Qt's own balloon (a TOOLTIP window);
- without a tray host isSystemTrayAvailable() is False and the icon does not dock; when a host
  appears later the same icon docks without the app doing anything.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from tests.ui.xscreen import WindowInfo, XScreen, menu_item_center

pytestmark = [pytest.mark.ui, pytest.mark.timeout(90)]

PROBE = Path(__file__).with_name("tray_probe.py")


def start_probe(screen: XScreen, events: Path, *extra: str) -> subprocess.Popen[bytes]:
    events.write_text("")
    return screen.popen([sys.executable, str(PROBE), str(events), *extra])


def wait_for_event(
    screen: XScreen, proc: subprocess.Popen[bytes], events: Path, line: str, timeout: float = 10.0
) -> list[str]:
    """Poll the probe's event file for `line`; fail early, with the app's output, if it died."""
    deadline = time.monotonic() + timeout
    while True:
        lines = events.read_text().splitlines()
        if line in lines:
            return lines
        if proc.poll() is not None:
            pytest.fail(
                f"probe exited {proc.returncode} before {line!r}; events {lines}\n{screen.log('python')}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"no {line!r} from the probe in {timeout}s; events {lines}\n{screen.log('python')}")
        time.sleep(0.05)


def changed_fraction(before: Path, after: Path, area: WindowInfo) -> float:
    """Share of the pixels inside `area` that differ between two screenshots."""
    a, b = QImage(str(before)), QImage(str(after))
    assert not a.isNull() and not b.isNull() and a.size() == b.size()
    changed = sum(
        a.pixel(x, y) != b.pixel(x, y)
        for x in range(area.x, area.x + area.width)
        for y in range(area.y, area.y + area.height)
    )
    return changed / (area.width * area.height)


def reddish_fraction(shot: Path, area: WindowInfo) -> float:
    """Share of `area` painted in the probe icon's red (#d02020, give or take scaling's blending)."""
    image = QImage(str(shot))
    colours = [
        image.pixelColor(x, y)
        for x in range(area.x, area.x + area.width)
        for y in range(area.y, area.y + area.height)
    ]
    return sum(c.red() > 160 and c.green() < 100 and c.blue() < 100 for c in colours) / len(colours)


def painted_icon(screen: XScreen, shots: Path) -> tuple[int, int]:
    """Centre of the docked icon once Qt has painted it: a click that lands between the dock's map
    and Qt's first paint can be lost while Qt is still taking the embed, so clicks wait for paint."""
    screen.wait_for_tray_icon(timeout=10)
    shot = shots / "docked.png"

    def painted() -> tuple[int, int] | None:
        icons = screen.tray_icons()
        if icons and reddish_fraction(screen.screenshot(shot), icons[0]) > 0.3:
            return icons[0].center
        return None

    return screen.wait_for("the docked icon to be painted", painted, 10)


def open_menu(screen: XScreen, icon: tuple[int, int]) -> WindowInfo:
    screen.click(*icon, button=3)
    return screen.wait_for_menu(timeout=5)


def test_icon_docks_menu_opens_pause_then_quit_by_clicks(xscreen: XScreen, tmp_path: Path) -> None:
    events = tmp_path / "events"
    began = time.monotonic()
    proc = start_probe(xscreen, events)
    assert wait_for_event(xscreen, proc, events, "shown")[0] == "available True"
    icon = xscreen.wait_for_tray_icon(timeout=10)
    docked = time.monotonic() - began
    # The icon sits in trayer's panel at the top right and is really painted there.
    assert icon[0] > 1280 - 64 and icon[1] < 32, icon
    time.sleep(0.3)  # a docked window is mapped before Qt's first paint lands; let it land
    before = xscreen.screenshot(tmp_path / "before.png")
    assert reddish_fraction(before, xscreen.tray_icons()[0]) > 0.3

    assert xscreen.menus() == []
    menu = open_menu(xscreen, icon)
    assert "Context" in " ".join(wait_for_event(xscreen, proc, events, "activated Context"))
    assert menu.height >= 30 and menu.width >= 50, menu
    time.sleep(0.3)  # same: mapped is not yet painted
    after = xscreen.screenshot(tmp_path / "menu.png")
    assert changed_fraction(before, after, menu) > 0.5

    xscreen.click(*menu_item_center(menu, index=0, count=2))
    wait_for_event(xscreen, proc, events, "Pause")
    xscreen.wait_for_no_menu(timeout=5)
    assert proc.poll() is None

    menu = open_menu(xscreen, icon)
    xscreen.click(*menu_item_center(menu, index=1, count=2))
    assert proc.wait(timeout=10) == 0
    assert events.read_text().splitlines()[-1] == "Quit"
    print(f"\nstartup: X screen + tray {xscreen.startup_seconds:.2f}s, probe docked after {docked:.2f}s")


def test_menu_by_keyboard(xscreen: XScreen, tmp_path: Path) -> None:
    events = tmp_path / "events"
    proc = start_probe(xscreen, events)
    icon = painted_icon(xscreen, tmp_path)
    open_menu(xscreen, icon)
    xscreen.key("Down", "Return")  # a menu opened by mouse has no current item; Down selects the first
    wait_for_event(xscreen, proc, events, "Pause")
    xscreen.wait_for_no_menu(timeout=5)
    open_menu(xscreen, icon)
    xscreen.key("Down", "Down", "Return")
    assert proc.wait(timeout=10) == 0
    assert events.read_text().splitlines()[-2:] == ["activated Context", "Quit"]


def test_left_click_is_trigger_and_opens_no_menu(xscreen: XScreen, tmp_path: Path) -> None:
    events = tmp_path / "events"
    proc = start_probe(xscreen, events)
    icon = painted_icon(xscreen, tmp_path)
    xscreen.click(*icon, button=1)
    wait_for_event(xscreen, proc, events, "activated Trigger")
    xscreen.double_click(*icon)  # Qt reports the first press as Trigger, then DoubleClick
    lines = wait_for_event(xscreen, proc, events, "activated DoubleClick")
    assert lines[-3:] == ["activated Trigger", "activated Trigger", "activated DoubleClick"]
    xscreen.click(*icon, button=2)
    wait_for_event(xscreen, proc, events, "activated MiddleClick")
    assert xscreen.menus() == []
    assert "activated Context" not in events.read_text().splitlines()


def test_show_message_without_notification_daemon_is_a_qt_balloon(xscreen: XScreen, tmp_path: Path) -> None:
    events = tmp_path / "events"
    proc = start_probe(xscreen, events, "--message")
    xscreen.wait_for_tray_icon(timeout=10)
    wait_for_event(xscreen, proc, events, "message-shown")

    found = xscreen.wait_for(
        "Qt's balloon (a TOOLTIP window taller than a tooltip)",
        lambda: next(
            (w for w in xscreen.windows() if "_NET_WM_WINDOW_TYPE_TOOLTIP" in w.types and w.height > 40), None
        ),
        timeout=5,
    )
    time.sleep(0.3)
    xscreen.screenshot(tmp_path / "balloon.png")
    xscreen.click(found.x + 20, found.y + found.height - 15)  # on the text, away from the close button
    wait_for_event(xscreen, proc, events, "message-clicked")


def test_no_tray_host_then_one_appears(xscreen_no_tray: XScreen, tmp_path: Path) -> None:
    screen = xscreen_no_tray
    assert not screen.tray_available()
    events = tmp_path / "events"
    proc = start_probe(screen, events, "--message")
    lines = wait_for_event(screen, proc, events, "message-shown")
    assert lines[0] == "available False"
    time.sleep(0.5)  # give a (wrong) dock or balloon a chance to show before asserting there is none
    assert screen.tray_icons() == [] and screen.windows() == []
    # A tray host that starts after the app (a slow login) still gets the icon, with no app code.
    screen.start_tray()
    screen.wait_for_tray_icon(timeout=10)
    assert proc.poll() is None
