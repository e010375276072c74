"""The packaged tray app on a real X screen: the bundle's executable, double-clicked as it were (no
arguments, a clean environment, no Python on PATH), shows its first-run window and its tray icon, and
quits cleanly on SIGTERM. Run by installers/ci-check with the unpacked bundle's path.

    python installers/app_check.py DIR/learning-at-home [SCREENSHOT.png]
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.ui.xscreen import XScreen  # the tests' Xvfb + trayer harness


def main() -> int:
    exe = Path(sys.argv[1]).resolve()
    shot = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    with tempfile.TemporaryDirectory(prefix="lah-app-check-") as home, XScreen() as screen:
        env = {
            "HOME": home,
            "PATH": "/usr/bin:/bin",
            "DISPLAY": screen.env["DISPLAY"],
            "XDG_RUNTIME_DIR": home,
            "DBUS_SESSION_BUS_ADDRESS": screen.env["DBUS_SESSION_BUS_ADDRESS"],
        }
        app = screen.popen([str(exe)], env=env, cwd=home)
        try:
            window = screen.wait_for_window("Learning@home: join", timeout=60)
            icon = screen.wait_for_tray_icon(timeout=30)
            if shot is not None:
                screen.screenshot(shot)
            print(f"app-check: first-run window {window.width}x{window.height}, tray icon at {icon}")
        except Exception as e:
            print(f"app-check FAILED: {e}\n{screen.log(exe.name)}", file=sys.stderr)
            return 1
        app.send_signal(signal.SIGTERM)
        code = app.wait(60)
        if code != 0:
            print(f"app-check FAILED: the app exited with {code} on SIGTERM", file=sys.stderr)
            return 1
        print("app-check: quit cleanly on SIGTERM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
