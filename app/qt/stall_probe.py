"""How long the GUI thread ever went without running its events: a 10 ms timer and the longest gap
between its ticks, one JSON line a second (``{"at": unix time, "max_stall_ms": that second's longest}``)
appended to a file. Only when ``LAH_STALL_PROBE`` names that file (the footprint benchmark); the app
never runs it otherwise, since the timer itself costs CPU."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer

TICK_MS = 10


class StallProbe(QObject):
    def __init__(self, path: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.path = path
        self.max_gap_ms = 0.0
        self.ticks = 0
        self._last = time.perf_counter()
        self._written = self._last
        self._timer = QTimer(self)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.timeout.connect(self._tick)
        self._timer.start(TICK_MS)

    def _tick(self) -> None:
        now = time.perf_counter()
        self.max_gap_ms = max(self.max_gap_ms, (now - self._last) * 1000 - TICK_MS)
        self._last = now
        self.ticks += 1
        if now - self._written >= 1.0:
            self._written = now
            line = {"at": time.time(), "max_stall_ms": round(self.max_gap_ms, 2), "ticks": self.ticks}
            with self.path.open("a") as f:
                f.write(json.dumps(line) + "\n")
            self.max_gap_ms, self.ticks = 0.0, 0


def from_environment(parent: QObject) -> StallProbe | None:
    path = os.environ.get("LAH_STALL_PROBE")
    return StallProbe(Path(path), parent) if path else None
