"""Fixtures for tests that drive the tray app on a real X screen (see xscreen.py for why).

`xscreen` is function-scoped: every test gets its own Xvfb and trayer (0.1-0.4 s to start, measured),
so a menu left open, a pointer or keyboard grab, or a crashed app in one test cannot leak into the
next. It does not skip when the tools are missing: scripts/services installs them, and a silently
skipped tray test would hide exactly the breakage these tests exist for.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.ui.xscreen import XScreen

NEEDED = {"Xvfb": "xvfb", "trayer": "trayer", "xdotool": "xdotool", "import": "imagemagick"}


def _require_tools() -> None:
    missing = [f"{tool} (apt package {pkg})" for tool, pkg in NEEDED.items() if shutil.which(tool) is None]
    if missing:
        pytest.fail("the X-screen tests need " + ", ".join(missing), pytrace=False)


@pytest.fixture
def xscreen() -> Iterator[XScreen]:
    """A started XScreen with the trayer tray host; closed (every process reaped) after the test."""
    _require_tools()
    with XScreen() as screen:
        yield screen


@pytest.fixture
def xscreen_no_tray() -> Iterator[XScreen]:
    """A started XScreen without a tray host: the desktop where isSystemTrayAvailable() is False."""
    _require_tools()
    with XScreen(tray=False) as screen:
        yield screen
