"""The app's pure parts, without a screen or sockets: what the tray says, the activity chart's rates,
credit milestones, login entries, snooze times, node log rotation, and that the app never loads torch."""

from __future__ import annotations

import itertools
import plistlib
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from app.core import autostart
from app.core.activity import Activity, clock_ticks, milestone_crossed
from app.core.notices import seconds_until_tomorrow
from app.core.presentation import human_bytes, present
from app.qt.supervisor import node_command, rotate


def test_each_state_has_its_icon_words_and_menu() -> None:
    running = {"state": "running", "reason": "contributing with your GPU", "experts": ["a", "b"]}
    v = present(running, "running", "", True)
    assert (v.icon, v.headline, v.paused) == ("contributing", "Contributing", False)
    assert v.reason == "Hosting 2 experts. Contributing with your GPU."
    assert present({"state": "paused", "reason": "x"}, "running", "", True).icon == "paused"
    assert present({"state": "paused"}, "running", "", True).paused is True
    waiting = present({"state": "waiting", "reason": "you are using the computer"}, "running", "", True)
    assert (waiting.icon, waiting.reason) == ("waiting", "You are using the computer.")
    snoozed = present({"state": "snoozed", "reason": "snoozed until 07:00"}, "running", "", True)
    assert snoozed.icon == "snoozed" and snoozed.paused
    down = present(
        {"state": "starting", "errors": [{"message": "coordinator unreachable"}]}, "running", "", True
    )
    assert (down.icon, down.headline) == ("error", "Cannot reach the project")
    assert present(None, "running", "", False).icon == "starting"  # not connected (yet)
    gave_up = present(running, "gave_up", "It crashed 5 times.", True)
    assert (gave_up.icon, gave_up.paused, gave_up.reason) == ("error", True, "It crashed 5 times.")
    assert present(running, "restarting", "Restarting in 2 s.", True).icon == "error"


def test_activity_rates_and_a_restarted_node() -> None:
    a = Activity(spacing_s=2.0)
    assert a.add({"requests_served": 0, "bytes_up": 0, "bytes_down": 0}, 0.0) is None  # the baseline
    assert a.add({"requests_served": 5, "bytes_up": 1024, "bytes_down": 0}, 1.0) is None  # too soon
    p = a.add({"requests_served": 10, "bytes_up": 4096, "bytes_down": 2048}, 2.0)
    assert p is not None and (p.requests_per_s, p.up_kib_s, p.down_kib_s) == (5.0, 2.0, 1.0)
    assert a.add({"requests_served": 1, "bytes_up": 0, "bytes_down": 0}, 4.0) is None  # counters reset
    p = a.add({"requests_served": 3, "bytes_up": 0, "bytes_down": 0}, 6.0)
    assert p is not None and p.requests_per_s == 1.0
    assert a.add({"requests_served": "many"}, 9.0) is None
    x, req, _, _ = a.series(6.0, 1_000.0)  # the clock's time of monotonic 6.0: 1,000.0
    assert x == [996.0, 1_000.0] and req == [5.0, 1.0]
    a.add({"requests_served": 10, "bytes_up": 0, "bytes_down": 0}, 700.0)
    assert len(a.points) == 1  # older than the window: dropped


def test_the_chart_reads_clock_times_at_round_steps() -> None:
    """It read "minutes ago" with ticks at -0.8, -0.6 ...: a person had to compute the time."""
    start = time.mktime((2026, 5, 2, 14, 2, 7, 0, 0, -1))  # local time
    minute = clock_ticks(start, start + 60)
    assert [label for _, label in minute] == ["14:02:15", "14:02:30", "14:02:45", "14:03:00"]
    ten = clock_ticks(start, start + 600)
    assert [label for _, label in ten] == ["14:04", "14:06", "14:08", "14:10", "14:12"]
    assert all(b - a == 120 for (a, _), (b, _) in itertools.pairwise(ten))
    assert len(clock_ticks(start, start + 3 * 3600)) <= 5 and clock_ticks(start, start) == []


def test_milestones_are_announced_once_each() -> None:
    assert milestone_crossed(0, 9.9) is None
    assert milestone_crossed(0, 10) == 10
    assert milestone_crossed(10, 150) == 100
    assert milestone_crossed(100, 100) is None
    assert milestone_crossed(5, 2_000) == 1_000  # only the highest of several passed at once


def test_login_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    command = ["/opt/Learning at home/learning-at-home"]
    autostart.set_enabled(True, command, platform="linux")
    entry = (tmp_path / "autostart" / "learning-at-home.desktop").read_text()
    assert "Exec='/opt/Learning at home/learning-at-home'" in entry and "Type=Application" in entry
    assert autostart.is_enabled(platform="linux")
    autostart.set_enabled(False, command, platform="linux")
    assert not autostart.is_enabled(platform="linux")
    agent = plistlib.loads(autostart.mac_agent(command))
    assert agent["ProgramArguments"] == command and agent["RunAtLoad"] is True
    assert autostart.windows_command_line([r"C:\Program Files\LAH\learning-at-home.exe"]) == (
        r'"C:\Program Files\LAH\learning-at-home.exe"'
    )
    with pytest.raises(OSError):
        autostart.set_enabled(True, command, platform="win32")  # the Run key is Windows' only


def test_snooze_until_tomorrow_morning() -> None:
    assert seconds_until_tomorrow(datetime(2026, 11, 30, 22, 0)) == 9 * 3600
    assert seconds_until_tomorrow(datetime(2026, 11, 30, 1, 30)) == 29.5 * 3600


def test_node_log_rotation(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    log.write_bytes(b"x" * 100)
    rotate(log, keep=2, max_bytes=50)
    assert not log.exists() and (tmp_path / "node.log.1").stat().st_size == 100
    log.write_bytes(b"y" * 100)
    rotate(log, keep=2, max_bytes=50)
    assert (tmp_path / "node.log.2").read_bytes() == b"x" * 100
    rotate(log, keep=2, max_bytes=50)  # nothing to rotate: fine


def test_the_node_is_the_same_program() -> None:
    assert node_command(["--coordinator", "u"]) == [sys.executable, "-m", "lah", "node", "--coordinator", "u"]
    assert human_bytes(512) == "512 B" and human_bytes(3 * 2**20) == "3.0 MiB"


def test_the_app_never_loads_torch_or_aiortc() -> None:
    """The app talks to the engine through the control API only; torch would cost it ~250 MiB."""
    code = (
        "import sys, lah.cli, app.qt.controller, app.qt.main, app.qt.wizard, app.qt.settings_window,"
        " app.qt.status_window;"
        "print(sorted(m for m in ('torch', 'aiortc', 'engine.node.volunteer') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


def test_about_says_which_record_layer_the_node_runs() -> None:
    from app.qt.about import about_text

    runtime = {"torch": "2.13.0+cpu (CPU build)", "transport": "Python (compiled record layer not loaded: x)"}
    text = about_text("http://site", {"runtime": runtime, "device": "CPU"})
    assert "Data channels: Python (compiled record layer not loaded: x)" in text
    assert "Data channels: not known yet" in about_text("http://site", None)
