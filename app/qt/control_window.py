"""The small window that stands in for the tray where the desktop has none (some Wayland/GNOME
sessions): the same state, reason and controls, and a one-time note saying why it is there."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QMenu, QToolButton, QVBoxLayout, QWidget

from app.core.presentation import View

from .actions import Actions
from .assets import icon

NO_TRAY_NOTE = (
    "Your desktop has no notification-area (tray) icons, so Learning@home shows this small window "
    "instead. Closing it hides it; it comes back when you start Learning@home again."
)


class ControlWindow(QWidget):
    def __init__(self, actions: Actions, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Learning@home")
        self.setWindowIcon(icon("app"))
        self.icon = QLabel(self)
        self.headline = QLabel(self)
        self.headline.setObjectName("headline")
        self.headline.setStyleSheet("font-size: 14pt; font-weight: 600;")
        self.reason = QLabel(self, wordWrap=True)
        self.reason.setObjectName("reason")
        self.note = QLabel(NO_TRAY_NOTE, self, wordWrap=True)
        self.note.setObjectName("noTrayNote")
        self.note.setVisible(False)
        top = QHBoxLayout()
        top.addWidget(self.icon, 0, Qt.AlignmentFlag.AlignTop)
        text = QVBoxLayout()
        text.addWidget(self.headline)
        text.addWidget(self.reason)
        top.addLayout(text, 1)
        grid = QGridLayout()
        snooze_menu = QMenu(self)
        snooze_menu.addAction(actions.snooze_hour)
        snooze_menu.addAction(actions.snooze_tomorrow)
        buttons = [
            actions.pause,
            actions.resume,
            None,
            actions.settings,
            actions.status,
            actions.site,
            actions.log,
            actions.about,
            actions.quit,
        ]
        for i, action in enumerate(buttons):
            button = QToolButton(self)
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
            if action is None:
                button.setText("Snooze")
                button.setMenu(snooze_menu)
                button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
                button.setAccessibleName("Snooze")
            else:
                button.setDefaultAction(action)
                button.setAccessibleName(action.text().replace("&", ""))
                # Pause and Resume take turns, as in the menu
                action.changed.connect(lambda b=button, a=action: b.setVisible(a.isVisible()))
                button.setVisible(action.isVisible())
            grid.addWidget(button, i // 3, i % 3)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.note)
        layout.addLayout(grid)

    def show_view(self, view: View) -> None:
        self.icon.setPixmap(icon(f"tray-{view.icon}").pixmap(48, 48))
        self.headline.setText(view.headline)
        self.reason.setText(view.reason)
