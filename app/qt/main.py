"""``lah app``: the tray app's entry point. One copy per user; Fusion style so it looks the same and
readable in light and dark on every desktop; logs rotated in the user log folder."""

from __future__ import annotations

import logging
import logging.handlers
import os
import signal
import socket
import sys
from collections.abc import Callable

from PySide6.QtCore import QSocketNotifier
from PySide6.QtWidgets import QApplication

from app.core.paths import AppPaths

from . import stall_probe
from .assets import icon
from .controller import AppController
from .single_instance import SingleInstance
from .theme import apply_color_scheme


def setup_logging(paths: AppPaths) -> None:
    paths.logs.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(paths.logs / "app.log", maxBytes=1 << 20, backupCount=3)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def make_qapp(argv: list[str]) -> QApplication:
    existing = QApplication.instance()
    qapp = existing if isinstance(existing, QApplication) else QApplication(argv)
    qapp.setApplicationName("Learning@home")
    qapp.setDesktopFileName("learning-at-home")
    qapp.setQuitOnLastWindowClosed(False)  # it lives in the tray
    qapp.setWindowIcon(icon("app"))
    apply_color_scheme(qapp, os.environ.get("LAH_COLOR_SCHEME", ""))  # default: the desktop's
    qapp.styleHints().colorSchemeChanged.connect(lambda _s: apply_color_scheme(qapp))
    return qapp


def quit_on_signals(qapp: QApplication, quit: Callable[[], None]) -> None:
    """SIGINT and SIGTERM (a logout, ``kill``, the demo's Ctrl+C) mean Quit: the node stops cleanly.

    Qt's loop never returns to Python by itself, so the signal wakes it through a socket pair that
    Python writes to (``set_wakeup_fd``); no timer polls for it."""
    rsock, wsock = socket.socketpair()
    rsock.setblocking(False)
    wsock.setblocking(False)
    signal.set_wakeup_fd(wsock.fileno())
    notifier = QSocketNotifier(rsock.fileno(), QSocketNotifier.Type.Read, qapp)
    notifier.activated.connect(lambda *_: rsock.recv(64))  # Python runs the handler right after
    qapp.setProperty("_lah_signal_socks", (rsock, wsock, notifier))  # keep them alive with the app
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: quit())


def main(*, coordinator: str | None = None, demo: bool = False) -> int:
    paths = AppPaths.default()
    setup_logging(paths)
    qapp = make_qapp(sys.argv[:1])
    instance = SingleInstance(str(paths.config.parent))
    try:
        first = instance.claim()
    except OSError as e:
        logging.getLogger(__name__).warning("single-instance socket: %s", e)
        first = True
    if not first:
        print("Learning@home is already running; its window was brought forward.", file=sys.stderr)
        return 0
    controller = AppController(qapp, paths=paths, coordinator=coordinator, demo=demo)
    instance.activated.connect(controller.bring_forward)
    quit_on_signals(qapp, controller.quit)
    probe = stall_probe.from_environment(qapp)  # the footprint benchmark's GUI-stall meter, else None
    controller.start()
    try:
        return qapp.exec()
    finally:
        del probe
        instance.close()
