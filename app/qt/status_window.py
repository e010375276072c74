"""The Status window: what the node does now, what it did today and this month, and a chart of the
last ten minutes against this computer's clock. Fed by the status stream (``status`` with ``follow``);
while it is open the controller has the node read the account's credit from the coordinator
(``refresh_credit``), and the credit is shown with the time it was read. "Work" says, in plain words,
whether the node is assigned, reachable and chosen: why it serves nothing, when it does not.
"Helps to train" links the site's page of each language model whose layers' experts the node hosts
(the status's ``lm_experiments``), where its validation loss and a sample of its text are; the link
opens in the browser through QDesktopServices, as the app's other links to the site do.

pyqtgraph is imported when the window is first built, so an app whose window was never opened does
not pay for it.
"""

from __future__ import annotations

import html
import time
from typing import Any
from urllib.parse import quote

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from app.core.activity import Activity
from app.core.presentation import View, human_bytes
from engine.control.credit import describe_credit

from .assets import icon


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
            ("work", "Work"),
            ("experts", "Experts hosted"),
            ("served", "Requests served"),
            ("today", "Data today"),
            ("month", "Data this month"),
            ("credit", "Credit"),
            ("energy", "Energy used"),
            ("device", "Runs on"),
        ):
            value = QLabel("-", box, wordWrap=True)
            value.setObjectName(f"status_{key}")
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            value.setAccessibleName(label)
            form.addRow(f"{label}:", value)
            self.fields[key] = value
        self.form = form
        self.models = QLabel(box, wordWrap=True)  # links: shown only for a node hosting a model's layers
        self.models.setObjectName("status_models")
        self.models.setAccessibleName("Helps to train")
        self.models.setTextFormat(Qt.TextFormat.RichText)
        self.models.setTextInteractionFlags(
            Qt.TextInteractionFlag.LinksAccessibleByMouse | Qt.TextInteractionFlag.LinksAccessibleByKeyboard
        )
        self.models.linkActivated.connect(open_link)
        form.insertRow(2, "Helps to train:", self.models)  # below the experts it is about
        form.setRowVisible(self.models, False)
        layout.addWidget(box)
        from .clock_axis import LABEL_OVERHANG_PX, ClockAxis  # with pyqtgraph: once the window is built

        pg.setConfigOptions(antialias=True, background=None, foreground=self.palette().text().color())
        self.chart = pg.PlotWidget(self, title="Recent activity", axisItems={"bottom": ClockAxis()})
        self.chart.setObjectName("activityChart")
        self.chart.setAccessibleName("Chart of requests served and data moved over the last ten minutes")
        self.chart.setMinimumHeight(220)
        self.chart.setLabel("left", "per second")
        self.chart.addLegend(offset=(10, 10))
        # room at the right for the newest time label, which is centred on the plot's last moment
        self.chart.getPlotItem().layout.setContentsMargins(0, 0, LABEL_OVERHANG_PX, 0)
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
        f["credit"].setText(describe_credit(status))
        seen = status.get("participation") or {}
        f["work"].setText(str(seen.get("summary") or "-"))
        kwh = status.get("energy_kwh")
        f["energy"].setText("-" if kwh is None else f"{kwh * 1000:.1f} Wh (estimate)")
        f["device"].setText(str(status.get("device", "-")))
        links = experiment_links(status)
        self.models.setText(
            ", ".join(f'<a href="{html.escape(url)}">{html.escape(name)}</a>' for name, url in links)
            + (" (its training on the site)" if len(links) == 1 else " (their training on the site)")
            if links
            else ""
        )
        self.form.setRowVisible(self.models, bool(links))
        if new_point and self.isVisible():
            self.redraw()

    def redraw(self) -> None:
        now, wall = time.monotonic(), time.time()
        x, req, up, down = self.activity.series(now, wall)
        self.curves["requests"].setData(x, req)
        self.curves["up"].setData(x, up)
        self.curves["down"].setData(x, down)
        # from a minute up to the ten minutes kept, and always from zero: a rate is read against zero
        span = min(600.0, max(60.0, wall - min(x, default=wall)))
        self.chart.setXRange(wall - span, wall, padding=0.02)
        self.chart.setYRange(0, max([1.0, *req, *up, *down]) * 1.1, padding=0)


def experiment_links(status: dict[str, Any]) -> list[tuple[str, str]]:
    """(model, its page on the site) for each language model whose experts the node hosts; none for a
    coordinator address that is not plain http(s) (the node's, but a link must not run anything)."""
    base = str(status.get("coordinator") or "").rstrip("/")
    if not base.startswith(("http://", "https://")):
        return []
    names = status.get("lm_experiments") or []
    return [(str(n), f"{base}/experiments/{quote(str(n), safe='')}") for n in names if n]


def open_link(url: str) -> None:
    """The system's browser, as the tray's "Open the site" does: the desktop opens it, the GUI goes on."""
    QDesktopServices.openUrl(QUrl(url))
