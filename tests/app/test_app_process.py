"""The tray app's own process stays light: neither torch, aiortc nor PyAV is loaded in it, before
consent or while its node child runs; only that child loads them.

``lah/cli.py`` once installed the transport patches before it dispatched any command, so ``lah app``
mapped libtorch, PyAV's codecs and OpenBLAS (355 MiB against 52 for a bare PySide6 tray). The process
is real (``python -m lah app``, offscreen Qt); what it loaded is read from ``/proc/PID/maps``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

from .conftest import Coordinator
from .helpers import consented, node_state

HEAVY = re.compile(r"libtorch|/torch/|/av/|/av\.libs/|pylibsrtp|/aiortc/|libopenblas")


def heavy_libraries(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
        return {m.group(0) for line in maps if (m := HEAVY.search(line))}


def start_app() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lah", "app"],
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def settle(app: subprocess.Popen[str], seconds: float) -> None:
    """Let the app start (imports and first window); fail at once if it exits."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert app.poll() is None, app.stderr.read() if app.stderr else "the app exited"
        time.sleep(0.2)


def test_the_first_run_window_loads_no_torch_or_aiortc(app_env: Path) -> None:
    app = start_app()
    try:
        settle(app, 6)
        assert heavy_libraries(app.pid) == set()
        assert psutil.Process(app.pid).memory_info().rss < 200 << 20
    finally:
        app.kill()
        app.wait(10)


def test_a_contributing_app_leaves_torch_to_its_node(app_env: Path, coordinator: Coordinator) -> None:
    consented(coordinator.url)
    app = start_app()
    try:
        deadline = time.monotonic() + 90
        while node_state() is None:
            assert time.monotonic() < deadline, "the app's node never answered"
            assert app.poll() is None
            time.sleep(0.5)
        children = psutil.Process(app.pid).children(recursive=True)
        assert children and any(heavy_libraries(c.pid) for c in children)  # the node holds them
        assert heavy_libraries(app.pid) == set()
    finally:
        for child in psutil.Process(app.pid).children(recursive=True) if app.poll() is None else []:
            child.kill()
        app.kill()
        app.wait(10)
