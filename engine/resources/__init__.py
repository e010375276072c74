"""Resources: the volunteer's limits and the governor that keeps the node inside them.

Layers, bottom up (each imports only those below it)::

    errors      the exception tree (below)
    schedule    weekly allowed hours, pure functions
    settings    the Settings model; TOML load (field-by-field repair, backup) and atomic save
    bandwidth   TokenBucket (asyncio, upload/download caps) and DataCapCounter (monthly, persisted)
    idle        user idle seconds: X11 / Windows / macOS / unknown, behind IdleSource; FedIdle (the app's)
    sensors     other programs' CPU, battery, NvmlGpu; the Readings snapshot
    energy      energy estimate: NVML power integrated, else CPU TDP share
    limits      torch threads, GPU memory fraction, empty_cache, CPU duty cycle
    system      SystemSensors: the real machine's readings for the governor
    decision    decide(): pure; State, Reason, Decision (priority order drawn there)
    governor    Governor: adaptive polling loop, work hooks, pub-sub of decisions
    watch       SettingsWatcher (a running node follows its edited file); command-line overrides

Exceptions::

    ResourceError
    ├── SettingsError        settings that cannot be used as given, or cannot be saved
    └── BandwidthError       misuse of a token bucket or the data-cap counter
        └── DataCapReached   this month's data cap is spent

Readings never raise for a missing or vanished device; they return None with a reason. Imports no Qt.

May import: engine.files
"""

from .bandwidth import DataCapCounter, TokenBucket
from .decision import Decision, Now, Reason, State, UserState, decide
from .energy import EnergyMeter
from .errors import BandwidthError, DataCapReached, ResourceError, SettingsError
from .governor import Governor, SensorSource, WorkHooks
from .idle import FedIdle, IdleReading, IdleSource, UnknownIdle, X11Idle, default_idle_source
from .limits import apply_torch_limits, cpu_pause_after, free_gpu_memory
from .sensors import GpuReading, NvmlGpu, Readings
from .settings import Schedule, Settings, load_settings, save_settings, settings_path, validated
from .system import SystemSensors
from .watch import SettingsWatcher, apply_overrides, format_overrides

__all__ = [
    "BandwidthError",
    "DataCapCounter",
    "DataCapReached",
    "Decision",
    "EnergyMeter",
    "FedIdle",
    "Governor",
    "GpuReading",
    "IdleReading",
    "IdleSource",
    "Now",
    "NvmlGpu",
    "Readings",
    "Reason",
    "ResourceError",
    "Schedule",
    "SensorSource",
    "Settings",
    "SettingsError",
    "SettingsWatcher",
    "State",
    "SystemSensors",
    "TokenBucket",
    "UnknownIdle",
    "UserState",
    "WorkHooks",
    "X11Idle",
    "apply_overrides",
    "apply_torch_limits",
    "cpu_pause_after",
    "decide",
    "default_idle_source",
    "format_overrides",
    "free_gpu_memory",
    "load_settings",
    "save_settings",
    "settings_path",
    "validated",
]
