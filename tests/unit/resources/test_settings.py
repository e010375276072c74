import tomllib
from pathlib import Path

import pytest

from engine.resources.errors import SettingsError
from engine.resources.settings import (
    Schedule,
    Settings,
    effective_cpu_threads,
    gpu_memory_fraction,
    load_settings,
    save_settings,
    validated,
)


def backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".bad-*"))


def test_defaults_follow_boinc() -> None:
    s = Settings()
    assert s.gpu_only_when_idle and s.idle_after_s == 180 and not s.run_on_battery
    assert (
        effective_cpu_threads(s, 8) == 4
        and effective_cpu_threads(s, 2) == 1
        and effective_cpu_threads(s, 1) == 1
    )
    assert effective_cpu_threads(Settings(cpu_threads=64), 8) == 7  # never all cores


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "settings.toml") == (Settings(), [])


def test_round_trip_and_atomic_save(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "settings.toml"
    s = Settings(use_gpu=False, idle_after_s=600, schedule=Schedule(sat=("22:00-06:00",), sun=()))
    save_settings(s, path)
    assert load_settings(path) == (s, [])
    assert [p.name for p in path.parent.iterdir()] == ["settings.toml"]  # no temp files left
    assert tomllib.loads(path.read_text())["schedule"]["sun"] == []


def test_corrupt_file_defaults_backup_and_repair(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text("use_gpu = tru\n[[[")
    s, warnings = load_settings(path)
    assert s == Settings()
    assert "could not be read" in warnings[0] and "using all defaults" in warnings[0]
    (bak,) = backups(path)
    assert bak.read_text() == "use_gpu = tru\n[[[" and bak.name in warnings[-1]
    assert load_settings(path) == (Settings(), [])  # repaired file loads clean


def test_hand_edited_wrong_types_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(
        'use_gpu = "yes"\nidle_after_s = 600\ncpu_threads = 2.5\nrun_on_battery = true\nnew_thing = 1\n'
        '[schedule]\nmon = ["09:00-17:00"]\ntue = "all day"\nwed = ["25:00-26:00"]\n'
    )
    s, warnings = load_settings(path)
    assert s.idle_after_s == 600 and s.run_on_battery and s.schedule.mon == ("09:00-17:00",)  # kept
    assert s.use_gpu is True and s.cpu_threads == 0 and s.schedule.tue == ("00:00-24:00",)  # defaults
    assert s.schedule.wed == ("00:00-24:00",)
    text = "\n".join(warnings)
    assert "'use_gpu' = 'yes': must be true or false, not text; using the default True." in text
    assert "'cpu_threads' = 2.5: must be a whole number" in text
    assert "'schedule.tue' = 'all day': must be a list" in text
    assert "'schedule.wed'" in text and "does not exist" in text
    assert "Unknown setting 'new_thing' ignored." in text
    assert len(backups(path)) == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("idle_after_s = 1", "must be a whole number >= 10"),
        ("gpu_max_temperature_c = 500", "<= 100"),
        ("cpu_max_percent = 0", ">= 1"),
        ("data_cap_reset_day = 31", "<= 28"),
        ("max_upload_kib_s = -5", ">= 0"),
    ],
)
def test_out_of_range_gets_message_and_default(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(line + "\nuse_gpu = false\n")
    s, warnings = load_settings(path)
    key = line.split(" ")[0]
    assert getattr(s, key) == getattr(Settings(), key)
    assert not s.use_gpu
    assert message in warnings[0] and "using the default" in warnings[0]


def test_second_backup_does_not_overwrite_first(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text("idle_after_s = 1\n")
    load_settings(path)
    path.write_text("idle_after_s = 2\n")
    load_settings(path)
    assert sorted(b.read_text() for b in backups(path)) == ["idle_after_s = 1\n", "idle_after_s = 2\n"]


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_bytes(b"\xff\xfe\x00")
    s, warnings = load_settings(path)
    assert s == Settings() and "UTF-8" in warnings[0]


def test_validated_rejects_bad_values_built_in_code() -> None:
    with pytest.raises(SettingsError, match="idle_after_s"):
        validated(Settings(idle_after_s=1))
    with pytest.raises(SettingsError, match=r"schedule\.mon"):
        save_settings(Settings(schedule=Schedule(mon=("8-17",))), Path("/nonexistent/never-written.toml"))


def test_gpu_memory_fraction() -> None:
    assert gpu_memory_fraction(Settings(), 8 << 30) == 0.5
    assert gpu_memory_fraction(Settings(gpu_memory_budget_mib=2048), 8 << 30) == 0.25
    assert gpu_memory_fraction(Settings(gpu_memory_budget_mib=99999), 8 << 30) == 0.95
