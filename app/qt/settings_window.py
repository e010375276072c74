"""The Settings window: every limit (the same form as the wizard), applied live through the node's
``set_limits`` without restarting it, and whether the app starts at login."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QCheckBox, QDialogButtonBox, QLabel, QScrollArea, QVBoxLayout, QWidget

from engine.resources import Settings, SettingsError

from .assets import icon
from .limits_form import LimitsForm

# apply(limits, autostart, done): done(error text or None) on the GUI thread
Apply = Callable[[dict[str, Any], bool, Callable[[str | None], None]], None]


class SettingsWindow(QWidget):
    def __init__(
        self, settings: Settings, autostart: bool, apply: Apply, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Learning@home: settings")
        self.setWindowIcon(icon("app"))
        self.apply_fn = apply
        self.form = LimitsForm(settings)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        self.autostart = QCheckBox("Start Learning@home when I log in", self)
        self.autostart.setChecked(autostart)
        self.message = QLabel("", self, wordWrap=True)
        self.message.setObjectName("settingsMessage")
        self.message.setAccessibleName("Result of applying the settings")
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Apply | QDialogButtonBox.StandardButton.Close, self
        )
        self.apply_button = self.buttons.button(QDialogButtonBox.StandardButton.Apply)
        self.apply_button.clicked.connect(self.apply)
        self.buttons.rejected.connect(self.close)
        self.form.validity_changed.connect(self.apply_button.setEnabled)
        layout = QVBoxLayout(self)
        layout.addWidget(scroll, 1)
        layout.addWidget(self.form.error_label)  # outside the scroll: always in sight
        layout.addWidget(self.autostart)
        layout.addWidget(self.message)
        layout.addWidget(self.buttons)
        self.resize(640, 720)

    def load(self, settings: Settings, autostart: bool) -> None:
        self.form.set_settings(settings)
        self.autostart.setChecked(autostart)
        self.message.setText("")

    def apply(self) -> None:
        try:
            self.form.settings()
        except SettingsError as e:
            self.message.setText(str(e))
            return
        self.apply_button.setEnabled(False)
        self.message.setText("Applying…")

        def done(error: str | None) -> None:
            self.apply_button.setEnabled(self.form.valid)
            self.message.setText(error or "Saved. The new limits are in force now.")

        self.apply_fn(self.form.values(), self.autostart.isChecked(), done)
