"""The status chart's time axis: this computer's clock at round steps (``activity.clock_ticks``), in
place of pyqtgraph's own ticks, which on "minutes ago" fell at -0.8, -0.6, ... and made a person compute.

Imported with pyqtgraph, when the status window is first built.
"""

from __future__ import annotations

from typing import Any

import pyqtgraph as pg  # type: ignore[import-untyped]

from app.core.activity import clock_label, clock_ticks

TICK_WIDTH_PX = 90  # room for one "14:05:30" and the gap to the next
LABEL_OVERHANG_PX = 30  # half a label's width


class ClockAxis(pg.AxisItem):  # type: ignore[misc]
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(orientation="bottom", **kwargs)
        # a label may reach this far past the plot's ends: the newest minute stays labelled at the right
        self.setStyle(hideOverlappingLabels=LABEL_OVERHANG_PX)

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:
        ticks = [t for t, _ in clock_ticks(minVal, maxVal, most=max(2, min(6, int(size // TICK_WIDTH_PX))))]
        step = ticks[1] - ticks[0] if len(ticks) > 1 else 60.0
        return [(step, ticks)]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [clock_label(v, spacing) for v in values]
