"""Every running node follows its settings file (1 of 3 did), and the command line's limits stay on top
of it: after a reload, after ``set_limits``, and never written into the file. No sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.account import MemoryTokenStore
from engine.control import NodeControl
from engine.node import Volunteer
from engine.p2p import Identity
from engine.resources import (
    Settings,
    SettingsError,
    SettingsWatcher,
    apply_overrides,
    load_settings,
    save_settings,
)


async def test_three_watchers_on_one_file_all_follow_an_edit(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    save_settings(Settings(cpu_max_percent=50), path)
    seen: list[list[int]] = [[], [], []]
    watchers = [
        SettingsWatcher(path, lambda s, _w, i=i: seen[i].append(s.cpu_max_percent), interval=0.02)
        for i in range(3)
    ]
    for w in watchers:
        w.start()
    try:
        save_settings(Settings(cpu_max_percent=30), path)  # as an editor, the app or another node would
        async with asyncio.timeout(5):
            while not all(seen):
                await asyncio.sleep(0.02)
        assert seen == [[30], [30], [30]]
        path.unlink()  # an editor deleting before it writes: no change, no fallback to the defaults
        await asyncio.sleep(0.1)
        path.write_text("cpu_max_percent = 20\n")
        async with asyncio.timeout(5):
            while not all(len(s) == 2 for s in seen):
                await asyncio.sleep(0.02)
        assert seen == [[30, 20], [30, 20], [30, 20]]
    finally:
        for w in watchers:
            await w.stop()


async def test_a_repaired_file_is_reported_with_its_warnings(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    save_settings(Settings(), path)
    watcher = SettingsWatcher(path, lambda s, w: None)
    path.write_text("cpu_max_percent = 500\nonly_when_idle = false\n")
    change = await asyncio.to_thread(watcher.check)
    assert change is not None
    settings, warnings = change
    assert settings.cpu_max_percent == 50 and settings.only_when_idle is False  # the rest is kept
    assert any("cpu_max_percent" in w for w in warnings)
    again = watcher.check()  # the repair rewrote the file: read once more, the same, nothing to repair
    assert again is not None and again == (settings, [])
    assert watcher.check() is None


def test_overrides_replace_the_files_values_and_bad_ones_are_refused() -> None:
    file = Settings(only_when_idle=True, cpu_max_percent=40)
    out = apply_overrides(file, {"only_when_idle": False})
    assert (out.only_when_idle, out.cpu_max_percent) == (False, 40)
    with pytest.raises(SettingsError):
        apply_overrides(file, {"cpu_max_percent": 0})
    with pytest.raises(SettingsError):
        apply_overrides(file, {"no_such_limit": 1})


async def test_overrides_survive_a_reload_and_never_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    save_settings(Settings(use_gpu=False, only_when_idle=True, cpu_max_percent=50), path)
    file_settings, _ = load_settings(path)
    overrides = {"only_when_idle": False, "pause_when_other_cpu_percent": 0}
    volunteer = Volunteer(
        Identity.generate(),
        "http://127.0.0.1:9",
        MemoryTokenStore(),
        apply_overrides(file_settings, overrides),
        tmp_path / "data",
    )
    control = NodeControl(volunteer, path, overrides=overrides, file_settings=file_settings)
    watcher = SettingsWatcher(path, lambda s, _w: control.reload(s), interval=0.02)
    watcher.start()
    try:
        save_settings(Settings(use_gpu=False, only_when_idle=True, cpu_max_percent=30), path)  # by hand
        async with asyncio.timeout(5):
            while volunteer.settings.cpu_max_percent != 30:
                await asyncio.sleep(0.02)
        assert volunteer.settings.only_when_idle is False  # the flag is still on top
        assert volunteer.settings.pause_when_other_cpu_percent == 0
        assert control.reload(load_settings(path)[0]) == []  # what it runs with already: no change
        # set_limits (the app, another client) saves the file's settings, not the flags
        applied = await control.set_limits({"cpu_max_percent": 20})
        assert applied["cpu_max_percent"] == 20 and applied["only_when_idle"] is False
        on_disk, _ = load_settings(path)
        assert (on_disk.cpu_max_percent, on_disk.only_when_idle) == (20, True)
        assert on_disk.pause_when_other_cpu_percent == 50
        assert control.status()["overrides"] == overrides
    finally:
        await watcher.stop()
        await volunteer.stop()
