"""LimitsForm: every limit of ``engine.resources.Settings`` as a labelled, explained, checked control.

Shared by the consent wizard and the Settings window, so the volunteer sees the same words in both.
Ranges come from the settings model itself (its ``ge``/``le`` bounds), so the form cannot drift from
what the node accepts; the schedule is checked with the engine's own parser as the user types.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

import msgspec
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.resources import Settings, SettingsError, validated
from engine.resources.schedule import DAYS, parse_range


@dataclass(frozen=True)
class Field:
    label: str
    help: str
    suffix: str = ""
    zero: str = ""  # what 0 means, shown instead of the number


GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Graphics card (GPU)",
        (
            "use_gpu",
            "gpu_only_when_idle",
            "gpu_memory_budget_mib",
            "gpu_max_temperature_c",
            "pause_when_other_gpu_percent",
            "gpu_index",
        ),
    ),
    (
        "Processor and memory",
        ("cpu_max_percent", "cpu_threads", "pause_when_other_cpu_percent", "ram_budget_mib"),
    ),
    ("When to contribute", ("only_when_idle", "idle_after_s", "run_on_battery")),
    ("Network", ("max_upload_kib_s", "max_download_kib_s", "monthly_data_cap_mib", "data_cap_reset_day")),
)

FIELDS: dict[str, Field] = {
    "use_gpu": Field(
        "Use the graphics card", "Experts run on the GPU when there is one; otherwise on the processor."
    ),
    "gpu_only_when_idle": Field(
        "GPU only while I'm away", "Never use the graphics card while you use the computer."
    ),
    "gpu_memory_budget_mib": Field(
        "GPU memory", "Most graphics memory the project may hold.", " MiB", "Half of it"
    ),
    "gpu_max_temperature_c": Field(
        "GPU temperature limit", "Pause when the GPU gets hotter than this.", " °C"
    ),
    "pause_when_other_gpu_percent": Field(
        "Pause when other programs use the GPU",
        "Above this share of GPU use by games or other programs.",
        " %",
        "Never",
    ),
    "gpu_index": Field("Which GPU", "For computers with more than one graphics card (0 is the first)."),
    "cpu_max_percent": Field("Processor use", "Most of the processor's time the project may take.", " %"),
    "cpu_threads": Field("Processor threads", "How many cores computations may use.", "", "Half of them"),
    "pause_when_other_cpu_percent": Field(
        "Pause when other programs are busy",
        "When other programs keep the processor this busy.",
        " %",
        "Never",
    ),
    "ram_budget_mib": Field("Memory (RAM)", "Most memory the experts may hold.", " MiB", "A quarter of it"),
    "only_when_idle": Field(
        "Only while I'm away", "Contribute only when nobody has used the keyboard or mouse for a while."
    ),
    "idle_after_s": Field("Away after", "How long without input counts as away.", " s"),
    "run_on_battery": Field("Also on battery", "Laptops: keep contributing when not plugged in."),
    "max_upload_kib_s": Field(
        "Upload speed limit", "Most the project may send per second.", " KiB/s", "No limit"
    ),
    "max_download_kib_s": Field(
        "Download speed limit", "Most the project may receive per second.", " KiB/s", "No limit"
    ),
    "monthly_data_cap_mib": Field(
        "Monthly data cap", "Stop for the month once this much was sent and received.", " MiB", "No cap"
    ),
    "data_cap_reset_day": Field("Month starts on day", "The day your internet plan's month begins."),
}


def _bounds(name: str) -> tuple[int, int]:
    field = next(f for f in msgspec.structs.fields(Settings) if f.name == name)
    lo, hi = 0, 2**31 - 1
    for meta in typing.get_args(field.type)[1:]:
        if isinstance(meta, msgspec.Meta):
            lo = int(meta.ge) if meta.ge is not None else lo
            hi = min(hi, int(meta.le)) if meta.le is not None else hi
    return lo, hi


class LimitsForm(QWidget):
    changed = Signal()
    validity_changed = Signal(bool)

    def __init__(self, settings: Settings | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._widgets: dict[str, QCheckBox | QSpinBox] = {}
        self._days: dict[str, QLineEdit] = {}
        self.error_label = QLabel(self, wordWrap=True)
        self.error_label.setObjectName("limitsErrors")
        self.error_label.setStyleSheet("font-weight: 600;")  # the text colour: readable light and dark
        layout = QVBoxLayout(self)
        for title, names in GROUPS:
            box = QGroupBox(title, self)
            form = QFormLayout(box)
            for name in names:
                self._add_field(form, name)
            layout.addWidget(box)
        box = QGroupBox("Schedule (hours when contributing is allowed)", self)
        form = QFormLayout(box)
        hint = QLabel("Ranges like 09:00-17:00, separated by commas; empty means never that day.", box)
        hint.setWordWrap(True)
        form.addRow(hint)
        for day in DAYS:
            edit = QLineEdit(box)
            edit.setAccessibleName(f"Allowed hours on {day.capitalize()}")
            edit.textChanged.connect(self._on_change)
            self._days[day] = edit
            form.addRow(f"&{day.capitalize()}", edit)
        layout.addWidget(box)
        layout.addWidget(self.error_label)
        self._valid = True
        self.set_settings(settings or Settings())

    def _add_field(self, form: QFormLayout, name: str) -> None:
        spec = FIELDS[name]
        default = getattr(Settings(), name)
        widget: QCheckBox | QSpinBox
        if isinstance(default, bool):
            widget = QCheckBox(spec.label, self)
            widget.toggled.connect(self._on_change)
        else:
            widget = QSpinBox(self)
            lo, hi = _bounds(name)
            widget.setRange(lo, hi)
            widget.setSuffix(spec.suffix)
            widget.setAccelerated(True)
            if spec.zero and lo == 0:
                widget.setSpecialValueText(spec.zero)
            widget.valueChanged.connect(self._on_change)
        widget.setObjectName(name)
        widget.setAccessibleName(spec.label)
        widget.setAccessibleDescription(spec.help)
        widget.setToolTip(spec.help)
        help_label = QLabel(spec.help, self)
        help_label.setWordWrap(True)
        help_label.setStyleSheet("color: palette(placeholder-text);")
        column = QWidget(self)
        inner = QVBoxLayout(column)
        inner.setContentsMargins(0, 0, 0, 0)
        inner.setSpacing(2)
        inner.addWidget(widget)
        inner.addWidget(help_label)
        if isinstance(widget, QCheckBox):
            form.addRow(column)
        else:
            label = QLabel(spec.label + ":", self)
            label.setBuddy(widget)
            form.addRow(label, column)
        self._widgets[name] = widget

    def widget(self, name: str) -> QCheckBox | QSpinBox | QLineEdit:
        return self._days[name] if name in self._days else self._widgets[name]

    def set_settings(self, settings: Settings) -> None:
        for name, widget in self._widgets.items():
            value = getattr(settings, name)
            if isinstance(widget, QCheckBox):
                widget.setChecked(bool(value))
            else:
                widget.setValue(int(value))
        for day, ranges in zip(DAYS, settings.schedule.days(), strict=True):
            self._days[day].setText(", ".join(ranges))
        self._on_change()

    def problems(self) -> list[str]:
        out = []
        for day, edit in self._days.items():
            for text in _split(edit.text()):
                try:
                    parse_range(text)
                except ValueError as e:
                    out.append(f"{day.capitalize()}: {e}")
        return out

    def values(self) -> dict[str, Any]:
        """The limits as ``set_limits`` takes them (only meaningful when ``problems()`` is empty)."""
        out: dict[str, Any] = {
            name: w.isChecked() if isinstance(w, QCheckBox) else w.value()
            for name, w in self._widgets.items()
        }
        out["schedule"] = {day: _split(edit.text()) for day, edit in self._days.items()}
        return out

    def settings(self) -> Settings:
        """Raises SettingsError if anything is out of bounds."""
        try:
            merged = {**msgspec.to_builtins(Settings()), **self.values()}
            return validated(msgspec.convert(merged, Settings))
        except msgspec.ValidationError as e:
            raise SettingsError(str(e)) from e

    @property
    def valid(self) -> bool:
        return self._valid

    def _on_change(self, *_: object) -> None:
        problems = self.problems()
        for edit in self._days.values():
            bad = any(_is_bad(t) for t in _split(edit.text()))
            edit.setStyleSheet("border: 2px solid #b42318;" if bad else "")
        self.error_label.setText("\n".join(f"⚠ {p}" for p in problems))
        self.error_label.setVisible(bool(problems))
        valid = not problems
        if valid != self._valid:
            self._valid = valid
            self.validity_changed.emit(valid)
        self.changed.emit()


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _is_bad(text: str) -> bool:
    try:
        parse_range(text)
        return False
    except ValueError:
        return True
