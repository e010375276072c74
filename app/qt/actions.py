"""The app's commands as QActions, shared by the tray menu and the no-tray window, so both offer the
same controls with the same names and shortcuts."""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QWidget


class Actions(QObject):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.status_line = QAction("Starting…", self)
        self.status_line.setEnabled(False)
        self.pause = QAction("&Pause", self)
        self.resume = QAction("&Resume", self)
        self.snooze_hour = QAction("For 1 &hour", self)
        self.snooze_tomorrow = QAction("Until &tomorrow", self)
        self.settings = QAction("&Settings…", self)
        self.status = QAction("S&tatus…", self)
        self.site = QAction("Open project &site", self)
        self.log = QAction("Show &log", self)
        self.about = QAction("&About Learning@home", self)
        self.quit = QAction("&Quit", self)
        self.update = QAction("", self)  # shown only when a newer release is known
        self.update.setVisible(False)

    def set_paused(self, paused: bool) -> None:
        self.pause.setVisible(not paused)
        self.resume.setVisible(paused)

    def build_menu(self, parent: QWidget | None = None) -> QMenu:
        menu = QMenu(parent)
        menu.setAccessibleName("Learning@home")
        menu.addAction(self.status_line)
        menu.addSeparator()
        menu.addAction(self.pause)
        menu.addAction(self.resume)
        snooze = menu.addMenu("S&nooze")
        snooze.addAction(self.snooze_hour)
        snooze.addAction(self.snooze_tomorrow)
        menu.addSeparator()
        menu.addAction(self.settings)
        menu.addAction(self.status)
        menu.addAction(self.site)
        menu.addAction(self.log)
        menu.addAction(self.update)
        menu.addSeparator()
        menu.addAction(self.about)
        menu.addAction(self.quit)
        return menu
