"""The tray app's own cost on a volunteer's machine: CPU while idle (windows closed, and with the status
window open), memory, and the longest stall of its GUI thread while the node is killed and restarted and
the coordinator goes down and comes back with the status window open.

Everything is real: Xvfb with the trayer tray host, the app as its own process (``python -m lah app``)
with its real node child, a real coordinator on 127.0.0.1. Only the app process is measured (not the
node). Baseline, measured the same way in the same run: a bare PySide6 tray program (the same Qt, the
same icon, nothing else) - what any Qt tray app costs at least. CPU is measured in ``--windows``
consecutive windows per phase and reported as median and spread (max - min).

Targets: idle CPU <= 0.5 % of a core with the status window closed, <= 2 % with it open, RSS <= 150
MiB, GUI stall < 50 ms. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.server.app import start_full
from engine.control import ConnectionInfo
from engine.moe import LoopThread
from lah.demo_app import user_folders
from tests.app.helpers import node_state
from tests.ui.xscreen import XScreen

BARE_TRAY = """
import sys
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMenu, QSystemTrayIcon
app = QApplication(sys.argv)
app.setQuitOnLastWindowClosed(False)
tray = QSystemTrayIcon(QIcon(sys.argv[1]))
menu = QMenu(); menu.addAction("Quit", app.quit)
tray.setContextMenu(menu); tray.show()
app.exec()
"""


def cpu_windows(pid: int, window_s: float, windows: int) -> list[float]:
    """Percent of one core used by the process (itself, not its children) in consecutive windows."""
    proc = psutil.Process(pid)
    out = []
    for _ in range(windows):
        t0, c0 = time.monotonic(), proc.cpu_times()
        time.sleep(window_s)
        t1, c1 = time.monotonic(), proc.cpu_times()
        out.append(100 * ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0))
    return out


def rss_mib(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "spread": round(max(values) - min(values), 3)}


def wait_for(what: str, probe: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.25)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def user_env(base: dict[str, str], root: Path, coordinator_url: str) -> dict[str, str]:
    from app.core.config import AppConfig, save_config
    from engine.resources import Settings, save_settings

    env = {**base, **user_folders(root), "LAH_HOST_ADDRESSES": "127.0.0.1"}
    env["PYTHON_KEYRING_BACKEND"] = "keyring.backends.fail.Keyring"
    config = root / "config" / "learning-at-home"
    save_config(
        AppConfig(consented=True, coordinator_url=coordinator_url, display_name="bench", autostart=False),
        config / "app.toml",
    )
    save_settings(
        Settings(use_gpu=False, only_when_idle=False, pause_when_other_cpu_percent=0),
        config / "settings.toml",
    )
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="15 s per phase instead of 60 s")
    parser.add_argument("--windows", type=int, default=3, help="CPU measurement windows per phase")
    args = parser.parse_args()
    phase_s = 15.0 if args.quick else 60.0
    window_s = phase_s / args.windows
    icon = Path(__file__).resolve().parents[1] / "assets" / "icons" / "app.svg"
    with tempfile.TemporaryDirectory(prefix="lah-footprint-") as tmp_name, XScreen() as screen:
        tmp = Path(tmp_name)
        loop = LoopThread("bench-coordinator")
        port = _free_port()

        def coordinator_up() -> Any:
            config = CoordinatorConfig(
                port=port,
                database_url=f"sqlite+aiosqlite:///{tmp / 'c.sqlite3'}",
                token_key_path=str(tmp / "token.key"),
                verify_workers=0,
                experiments=[
                    ExperimentConfig(
                        name="ffn", expert_type="ffn", grid=[2, 2], hyperparams={"d_model": 64, "hidden": 256}
                    )
                ],
            )
            return loop.run(start_full(config), 30)

        running = coordinator_up()
        url = running.url
        env = user_env(screen.env, tmp / "user", url)
        control = tmp / "user" / "run" / "learning-at-home" / "control.json"
        results: dict[str, Any] = {"phase_s": phase_s, "windows": args.windows}

        print("baseline: a bare PySide6 tray icon", flush=True)
        bare = screen.popen([sys.executable, "-c", BARE_TRAY, str(icon)])
        screen.wait_for_tray_icon(timeout=30)
        time.sleep(3)
        bare_cpu = cpu_windows(bare.pid, window_s, args.windows)
        bare_rss = rss_mib(bare.pid)
        bare.terminate()
        bare.wait(15)

        print("the app, windows closed, its node contributing", flush=True)
        app = screen.popen([sys.executable, "-m", "lah", "app"], env=env)
        wait_for("the node to run", lambda: node_state(control) == "running", 120)
        time.sleep(5)
        idle = cpu_windows(app.pid, window_s, args.windows)
        rss_idle = rss_mib(app.pid)
        print("the app, status window open", flush=True)
        subprocess.run([sys.executable, "-m", "lah", "app"], env=env, timeout=60, capture_output=True)
        screen.wait_for_window("Learning@home: status", timeout=30)
        time.sleep(3)
        opened = cpu_windows(app.pid, window_s, args.windows)
        rss_open = rss_mib(app.pid)
        app.send_signal(signal.SIGTERM)
        app.wait(60)
        wait_for("the first app's node to be gone", lambda: not control.exists(), 60)

        print(
            "GUI stalls: node killed and restarted, coordinator down and back, status window open", flush=True
        )
        probe = tmp / "stalls.jsonl"
        app = screen.popen([sys.executable, "-m", "lah", "app"], env={**env, "LAH_STALL_PROBE": str(probe)})
        wait_for("the node to run", lambda: node_state(control) == "running", 120)
        subprocess.run([sys.executable, "-m", "lah", "app"], env=env, timeout=60, capture_output=True)
        screen.wait_for_window("Learning@home: status", timeout=30)
        time.sleep(3)
        wait_for("the node to run", lambda: node_state(control) == "running", 120)
        began = time.time()
        os.kill(ConnectionInfo.read(control).pid, signal.SIGKILL)
        time.sleep(1)
        wait_for("the node to be restarted", lambda: node_state(control) == "running", 120)
        loop.run(running.stop(), 30)
        time.sleep(10)  # the node and the app see the coordinator gone
        running = coordinator_up()
        time.sleep(10)
        wait_for("the node to run again", lambda: node_state(control) == "running", 120)
        ended = time.time()
        lines = [json.loads(x) for x in probe.read_text().splitlines() if x.strip()]
        during = [x["max_stall_ms"] for x in lines if began <= x["at"] <= ended + 1]
        app.send_signal(signal.SIGTERM)
        app.wait(60)
        loop.run(running.stop(), 30)
        loop.close()

    results.update(
        idle_cpu_pct=summary(idle)["median"],
        idle_cpu_spread=summary(idle)["spread"],
        open_cpu_pct=summary(opened)["median"],
        open_cpu_spread=summary(opened)["spread"],
        rss_mib=round(max(rss_idle, rss_open), 1),
        rss_idle_mib=round(rss_idle, 1),
        baseline_idle_cpu_pct=summary(bare_cpu)["median"],
        baseline_rss_mib=round(bare_rss, 1),
        rss_ratio=round(max(rss_idle, rss_open) / bare_rss, 2),
        max_gui_stall_ms=round(max(during, default=float("nan")), 1),
        stall_seconds_measured=len(during),
    )
    results["targets_met"] = {
        "idle_cpu": results["idle_cpu_pct"] <= 0.5,
        "open_cpu": results["open_cpu_pct"] <= 2.0,
        "rss": results["rss_mib"] <= 150,
        "gui_stall": results["max_gui_stall_ms"] < 50,
    }
    print(json.dumps(results))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


if __name__ == "__main__":
    main()
