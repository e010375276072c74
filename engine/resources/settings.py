"""The volunteer's limits: a settings model stored as TOML in the user config folder.

Defaults follow the established volunteer clients (BOINC): the GPU only while the computer is idle, idle
after 3 minutes without input, nothing on battery, and never all CPU cores (half of them by default).

Loading is field by field: a value of the wrong type or out of range gets a plain message and its default,
and every other field keeps what the volunteer wrote. A file that cannot be parsed at all gives all
defaults. Either way the original is kept beside it as ``settings.toml.bad-<timestamp>`` and the repaired
settings are written back, so the messages appear once.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import tomllib
from pathlib import Path
from typing import Annotated, Any

import msgspec
import platformdirs
import tomli_w

from engine.files import atomic_write

from .errors import SettingsError
from .schedule import ALL_DAY, DAYS, parse_range

APP_NAME = "learning-at-home"
SETTINGS_FILE = "settings.toml"
SETTINGS_VERSION = 1

TimeRange = Annotated[str, msgspec.Meta(pattern=r"^\d\d:\d\d-\d\d:\d\d$")]
DayRanges = tuple[TimeRange, ...]
_ALL = (ALL_DAY,)


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """Allowed hours per weekday, local time (see ``schedule.py`` for the range syntax)."""

    mon: DayRanges = _ALL
    tue: DayRanges = _ALL
    wed: DayRanges = _ALL
    thu: DayRanges = _ALL
    fri: DayRanges = _ALL
    sat: DayRanges = _ALL
    sun: DayRanges = _ALL

    def days(self) -> tuple[DayRanges, ...]:
        return tuple(getattr(self, d) for d in DAYS)


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """What the volunteer allows. ``0`` means "automatic" or "no limit" where the comment says so."""

    version: int = SETTINGS_VERSION
    # GPU
    use_gpu: bool = True
    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=63)] = 0
    gpu_memory_budget_mib: Annotated[int, msgspec.Meta(ge=0, le=1 << 22)] = 0  # 0 = half of the GPU's memory
    gpu_max_temperature_c: Annotated[int, msgspec.Meta(ge=40, le=100)] = 80
    gpu_only_when_idle: bool = True
    pause_when_other_gpu_percent: Annotated[int, msgspec.Meta(ge=0, le=100)] = (
        10  # 0 = never pause for other GPU programs
    )
    # CPU and memory
    cpu_threads: Annotated[int, msgspec.Meta(ge=0, le=1024)] = (
        0  # 0 = half the logical cores; never all of them
    )
    cpu_max_percent: Annotated[int, msgspec.Meta(ge=1, le=100)] = (
        50  # cap on the node's share of total CPU time
    )
    pause_when_other_cpu_percent: Annotated[int, msgspec.Meta(ge=0, le=100)] = (
        50  # 0 = never pause for other programs' CPU use
    )
    ram_budget_mib: Annotated[int, msgspec.Meta(ge=0, le=1 << 24)] = 0  # 0 = a quarter of the RAM
    # when
    only_when_idle: bool = True
    idle_after_s: Annotated[int, msgspec.Meta(ge=10, le=86_400)] = 180
    run_on_battery: bool = False
    schedule: Schedule = msgspec.field(default_factory=Schedule)
    # network
    max_upload_kib_s: Annotated[int, msgspec.Meta(ge=0, le=1 << 30)] = 0  # 0 = unlimited
    max_download_kib_s: Annotated[int, msgspec.Meta(ge=0, le=1 << 30)] = 0  # 0 = unlimited
    monthly_data_cap_mib: Annotated[int, msgspec.Meta(ge=0, le=1 << 30)] = 0  # 0 = no cap
    data_cap_reset_day: Annotated[int, msgspec.Meta(ge=1, le=28)] = 1


def settings_path() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / SETTINGS_FILE


# -- derived limits (pure) ---------------------------------------------------------------------------------


def effective_cpu_threads(settings: Settings, cpu_count: int | None = None) -> int:
    """Threads for compute: the setting, else half the cores; never all cores where there are two or more."""
    n = cpu_count or os.cpu_count() or 1
    most = max(1, n - 1)
    wanted = settings.cpu_threads or max(1, n // 2)
    return min(wanted, most)


def gpu_memory_fraction(settings: Settings, total_bytes: int) -> float:
    """The budget as a fraction of the GPU's memory, for ``torch.cuda.set_per_process_memory_fraction``."""
    if total_bytes <= 0:
        return 0.0
    if settings.gpu_memory_budget_mib == 0:
        return 0.5
    return min(0.95, settings.gpu_memory_budget_mib * 2**20 / total_bytes)


def ram_budget_bytes(settings: Settings, total_bytes: int) -> int:
    if settings.ram_budget_mib == 0:
        return total_bytes // 4
    return min(settings.ram_budget_mib * 2**20, total_bytes)


def monthly_data_cap_bytes(settings: Settings) -> int | None:
    return settings.monthly_data_cap_mib * 2**20 or None


# -- validation --------------------------------------------------------------------------------------------


_KINDS = {
    "int": "a whole number",
    "bool": "true or false",
    "array": "a list",
    "str": "text",
    "float": "a number",
}
_EXPECTED = re.compile(r"^Expected `(\w+)`(.*?)(?:, got `(\w+)`)?(?: - at `.*`)?$")


def _describe(err: msgspec.ValidationError) -> str:
    """msgspec's "Expected `int` >= 10" -> "must be a whole number >= 10"."""
    text = str(err)
    m = _EXPECTED.match(text)
    if m is None:
        return text
    kind, bound, got = m.groups()
    out = f"must be {_KINDS.get(kind, kind)}{bound}"
    if got:
        out += f", not {_KINDS.get(got, got)}"
    return out


def _check_field(struct: type[msgspec.Struct], name: str, value: Any) -> Any:
    """Convert one field's raw value; raise ValueError with a plain message."""
    field = next(f for f in msgspec.structs.fields(struct) if f.name == name)
    try:
        out = msgspec.convert(value, type=field.type, strict=True)
    except msgspec.ValidationError as e:
        raise ValueError(_describe(e)) from None
    if struct is Schedule:
        for text in out:
            parse_range(text)
    return out


def load_fields(struct: type[msgspec.Struct], raw: dict[str, Any], where: str, warnings: list[str]) -> Any:
    """Build ``struct`` from ``raw`` field by field: a bad or unknown field gets a plain message in
    ``warnings`` (prefixed with ``where``) and its default; the others keep their values."""
    values: dict[str, Any] = {}
    known = {f.name: f for f in msgspec.structs.fields(struct)}
    for key, value in raw.items():
        label = f"{where}{key}"
        field = known.get(key)
        if field is None:
            warnings.append(f"Unknown setting '{label}' ignored.")
            continue
        if field.type is Schedule:
            if isinstance(value, dict):
                values[key] = load_fields(Schedule, value, f"{key}.", warnings)
            else:
                warnings.append(
                    f"Setting '{label}' must be a table of weekdays; using the default (every hour)."
                )
            continue
        try:
            values[key] = _check_field(struct, key, value)
        except ValueError as e:
            default = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
            shown = list(default) if isinstance(default, tuple) else default
            warnings.append(f"Setting '{label}' = {value!r}: {e}; using the default {shown!r}.")
    return struct(**values)


def parse_settings(text: str) -> tuple[Settings, list[str]]:
    """TOML text -> settings plus plain messages about anything that was replaced by its default."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return Settings(), [f"The settings file could not be read ({e}); using all defaults."]
    warnings: list[str] = []
    settings = load_fields(Settings, raw, "", warnings)
    assert isinstance(settings, Settings)
    return settings, warnings


def keep_backup(path: Path) -> Path:
    """Copy a file that had to be repaired to ``<name>.bad-<timestamp>`` beside it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = path.with_name(f"{path.name}.bad-{stamp}")
    n = 1
    while backup.exists():
        backup = path.with_name(f"{path.name}.bad-{stamp}-{n}")
        n += 1
    shutil.copy2(path, backup)
    return backup


def load_settings(path: Path | None = None) -> tuple[Settings, list[str]]:
    """Read settings; a missing file gives defaults. Never raises for bad content (see module docstring)."""
    path = path or settings_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Settings(), []
    except OSError as e:
        return Settings(), [f"The settings file {path} could not be opened ({e}); using all defaults."]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        settings, warnings = Settings(), ["The settings file is not UTF-8 text; using all defaults."]
    else:
        settings, warnings = parse_settings(text)
    if warnings:
        try:
            backup = keep_backup(path)
            warnings.append(f"The original file was kept as {backup.name}.")
            save_settings(settings, path)
        except OSError as e:
            warnings.append(f"Could not keep a backup or write the repaired settings ({e}).")
    return settings, warnings


def dumps_settings(settings: Settings) -> str:
    return tomli_w.dumps(msgspec.to_builtins(settings))


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Validate, then write atomically (temp file + fsync + rename). Raises SettingsError."""
    settings = validated(settings)
    try:
        atomic_write(path or settings_path(), dumps_settings(settings).encode())
    except OSError as e:
        raise SettingsError(f"Could not save the settings ({e}).") from e


def validated(settings: Settings) -> Settings:
    """Check a settings object built in code (e.g. by the tray); raise SettingsError listing every problem."""
    warnings: list[str] = []
    out = load_fields(Settings, msgspec.to_builtins(settings), "", warnings)
    if warnings:
        raise SettingsError(" ".join(w.split(";")[0] + "." for w in warnings))
    assert isinstance(out, Settings)
    return out
