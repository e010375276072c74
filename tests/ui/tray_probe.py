"""A tiny real tray app for the X-screen harness: what the harness must be able to see and drive.

Run as a child process under XScreen.env: ``python tray_probe.py EVENTS_FILE [--message]``.
Every observable thing is appended to EVENTS_FILE as one line, flushed at once, so a test can poll
the file instead of guessing at timing:

    available True|False   QSystemTrayIcon.isSystemTrayAvailable() at startup
    shown                  the icon was asked to show (it docks whenever a tray host owns the selection)
    activated <Reason>     the icon's `activated` signal (Trigger, Context, DoubleClick, MiddleClick)
    message-shown          after showMessage() (only with --message)
    message-clicked        the balloon/notification was clicked
    Pause                  the "Pause" menu action was chosen
    Quit                   the "Quit" menu action was chosen; the app then exits 0
"""

from __future__ import annotations

import signal
import sys

from PySide6.QtCore import QTimer
from PySide6.QtGui import QAction, QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QApplication, QMenu, QSystemTrayIcon


def main() -> int:
    path = sys.argv[1]
    message = "--message" in sys.argv[2:]

    def log(line: str) -> None:
        with open(path, "a") as out:  # one open per event: each line is on disk when it happens
            out.write(line + "\n")

    app = QApplication(sys.argv[:1])
    app.setQuitOnLastWindowClosed(False)  # a tray app has no window; closing the menu must not quit
    # SIGTERM from the harness's teardown: quit through Qt so the icon is removed cleanly.
    signal.signal(signal.SIGTERM, lambda *_: app.quit())
    wake = QTimer()
    wake.start(100)  # lets Python run its signal handlers while Qt's loop is in C++
    wake.timeout.connect(lambda: None)

    # A solid, high-contrast square: easy to find in a screenshot, no image files needed.
    pixmap = QPixmap(64, 64)
    pixmap.fill(QColor("#d02020"))
    painter = QPainter(pixmap)
    painter.fillRect(16, 16, 32, 32, QColor("#ffffff"))
    painter.end()

    log(f"available {QSystemTrayIcon.isSystemTrayAvailable()}")
    tray = QSystemTrayIcon(QIcon(pixmap))
    tray.setToolTip("tray probe")
    menu = QMenu()
    pause = QAction("Pause", menu)
    quit_ = QAction("Quit", menu)
    menu.addAction(pause)
    menu.addAction(quit_)
    tray.setContextMenu(menu)

    pause.triggered.connect(lambda: log("Pause"))

    def on_quit() -> None:
        log("Quit")
        app.quit()

    quit_.triggered.connect(on_quit)
    tray.activated.connect(lambda reason: log(f"activated {reason.name}"))
    tray.messageClicked.connect(lambda: log("message-clicked"))
    tray.show()
    log("shown")

    if message:

        def show_message() -> None:
            tray.showMessage(
                "tray probe", "a balloon from the probe", QSystemTrayIcon.MessageIcon.Information, 20000
            )
            log("message-shown")

        QTimer.singleShot(500, show_message)  # after the icon has docked, so the balloon has an anchor

    code = app.exec()
    tray.hide()
    return code


if __name__ == "__main__":
    sys.exit(main())
