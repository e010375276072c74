"""The Status window: what the node does now, what it did today and this month, and a chart of the
last ten minutes. Fed by the status stream (``status`` with ``follow``); never asks anything itself.

pyqtgraph is imported when the window is first built, so an app whose window was never opened does
not pay for it.
"""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from .activity import Activity
from .assets import icon
from .presentation import View, human_bytes


class StatusWindow(QWidget):
    def __init__(self, activity: Activity, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        import pyqtgraph as pg  # type: ignore[import-untyped]

        self.setWindowTitle("Learning@home: status")
        self.setWindowIcon(icon("app"))
        self.activity = activity
        layout = QVBoxLayout(self)
        self.headline = QLabel(self)
        self.headline.setObjectName("headline")
        self.headline.setStyleSheet("font-size: 16pt; font-weight: 600;")
        self.reason = QLabel(self, wordWrap=True)
        self.reason.setObjectName("reason")
        layout.addWidget(self.headline)
        layout.addWidget(self.reason)
        box = QGroupBox("This computer's contribution", self)
        form = QFormLayout(box)
        self.fields: dict[str, QLabel] = {}
        for key, label in (
            ("experts", "Experts hosted"),
            ("served", "Requests served"),
            ("today", "Data today"),
            ("month", "Data this month"),
            ("credit", "Credit"),
            ("energy", "Energy used"),
            ("device", "Runs on"),
        ):
            value = QLabel("-", box)
            value.setObjectName(f"status_{key}")
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            value.setAccessibleName(label)
            form.addRow(f"{label}:", value)
            self.fields[key] = value
        layout.addWidget(box)
        pg.setConfigOptions(antialias=True, background=None, foreground=self.palette().text().color())
        self.chart = pg.PlotWidget(self, title="Recent activity")
        self.chart.setObjectName("activityChart")
        self.chart.setAccessibleName("Chart of requests served and data moved over the last ten minutes")
        self.chart.setMinimumHeight(220)
        self.chart.setLabel("bottom", "minutes ago")
        self.chart.setLabel("left", "per second")
        self.chart.addLegend(offset=(10, 10))
        self.curves = {
            "requests": self.chart.plot(name="requests", pen=pg.mkPen("#1f7a4d", width=2)),
            "up": self.chart.plot(name="KiB up", pen=pg.mkPen("#3b5bdb", width=2)),
            "down": self.chart.plot(
                name="KiB down", pen=pg.mkPen("#f08c00", width=2, style=Qt.PenStyle.DashLine)
            ),
        }
        layout.addWidget(self.chart, 1)
        self.resize(560, 600)

    def show_view(self, view: View) -> None:
        self.headline.setText(view.headline)
        self.reason.setText(view.reason)

    def show_status(self, status: dict[str, Any], new_point: bool = True) -> None:
        """``new_point``: whether the chart has a point to add (at most every two seconds); the
        numbers change with every update, the chart need not be redrawn for each."""
        f = self.fields
        experts = status.get("experts") or []
        f["experts"].setText(
            f"{len(experts)}"
            + (f" ({', '.join(experts[:6])}{'…' if len(experts) > 6 else ''})" if experts else "")
        )
        served, refused = status.get("requests_served", 0), status.get("requests_refused", 0)
        f["served"].setText(f"{served:,} (turned away while paused or waiting: {refused:,})")
        traffic = status.get("traffic") or {}
        if traffic:
            up, down = human_bytes(traffic.get("today_up", 0)), human_bytes(traffic.get("today_down", 0))
            f["today"].setText(f"{up} up, {down} down")
            used = traffic.get("period_up", 0) + traffic.get("period_down", 0)
            cap = traffic.get("cap_bytes")
            f["month"].setText(
                f"{human_bytes(used)} of {human_bytes(cap)} cap" if cap else f"{human_bytes(used)} (no cap)"
            )
        credit, rank = status.get("credit"), status.get("rank")
        if credit is None:
            f["credit"].setText("not reported yet")
        else:
            f["credit"].setText(f"{credit:,.1f}" + (f" (rank #{rank:,})" if rank else ""))
        kwh = status.get("energy_kwh")
        f["energy"].setText("-" if kwh is None else f"{kwh * 1000:.1f} Wh (estimate)")
        f["device"].setText(str(status.get("device", "-")))
        if new_point and self.isVisible():
            self.redraw()

    def redraw(self) -> None:
        x, req, up, down = self.activity.series(time.monotonic())
        self.curves["requests"].setData(x, req)
        self.curves["up"].setData(x, up)
        self.curves["down"].setData(x, down)
        # from a minute up to the ten minutes kept, and always from zero: a rate is read against zero
        span = min(10.0, max(1.0, -min(x, default=0.0)))
        self.chart.setXRange(-span, 0, padding=0.02)
        self.chart.setYRange(0, max([1.0, *req, *up, *down]) * 1.1, padding=0)
