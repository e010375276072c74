"""What ``lah node`` adds for a node that nobody sits in front of: limits on its command line, plain words
on why it waits and what changes that, and a log file in its home.

A server has no display, so the node cannot tell whether anyone uses it: with ``only_when_idle`` (the
default) it waits until told otherwise, and on a busy machine ``pause_when_other_cpu_percent`` keeps it
waiting too. :func:`hint_for` names the setting and the flag for each such wait, for the log and for
``lah status``. The flags are the settings' own names (``--pause-when-other-cpu-percent 0``,
``--no-only-when-idle``) and override the settings file for this run, also after it is reloaded.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.resources import Decision, Reason, Settings, SettingsError, apply_overrides

__all__ = ["LIMIT_FLAGS", "NodeLog", "add_limit_flags", "flag", "hint_for", "limit_overrides"]

# The limits a server's operator sets, by setting name (README: "A volunteer on a server").
LIMIT_FLAGS: dict[str, str] = {
    "only_when_idle": "work only while nobody uses the computer (default); --no-only-when-idle: regardless, "
    "as a server with no display must",
    "gpu_only_when_idle": "the same for the GPU (--no-gpu-only-when-idle: use it regardless)",
    "idle_after_s": "seconds without keyboard or mouse input that count as away",
    "pause_when_other_cpu_percent": "wait while other programs use this %% of the CPU (0: never wait)",
    "pause_when_other_gpu_percent": "wait while other programs use this %% of the GPU (0: never)",
    "cpu_max_percent": "the most of the CPU's time this node may take, %%",
    "cpu_threads": "threads for computing (0: half the cores; never all of them)",
    "ram_budget_mib": "memory for experts, MiB (0: a quarter of the RAM)",
    "use_gpu": "run experts on the GPU where there is one (--no-use-gpu: the CPU only)",
    "gpu_memory_budget_mib": "GPU memory this node may hold, MiB (0: half of it)",
    "max_upload_kib_s": "upload cap, KiB/s (0: none)",
    "max_download_kib_s": "download cap, KiB/s (0: none)",
    "monthly_data_cap_mib": "stop for the month after this much traffic, MiB (0: no cap)",
}


def flag(name: str, value: Any = None) -> str:
    """A setting's spelling on the command line: ``--cpu-max-percent 80``, ``--no-only-when-idle``."""
    dashed = name.replace("_", "-")
    if isinstance(value, bool):
        return f"--{dashed}" if value else f"--no-{dashed}"
    return f"--{dashed}" if value is None else f"--{dashed} {value}"


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "limits for this run",
        "override the settings file (also after it is edited) and are never saved to it",
    )
    defaults = Settings()
    for name, text in LIMIT_FLAGS.items():
        if isinstance(getattr(defaults, name), bool):
            action: Any = argparse.BooleanOptionalAction
            group.add_argument(flag(name), dest=f"limit_{name}", action=action, default=None, help=text)
        else:
            group.add_argument(
                flag(name), dest=f"limit_{name}", type=int, metavar="N", default=None, help=text
            )


def limit_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The limits given as flags; SettingsError names each bad flag and why, so that the node refuses to
    start with a plain message rather than run with a limit the operator did not mean."""
    given = {n: getattr(args, f"limit_{n}", None) for n in LIMIT_FLAGS}
    overrides = {n: v for n, v in given.items() if v is not None}
    problems = []
    for name, value in overrides.items():
        try:
            apply_overrides(Settings(), {name: value})
        except SettingsError as e:
            why = str(e).split(": ", 1)[-1].rstrip(".")
            problems.append(f"{flag(name, value)}: {why}")
    if problems:
        raise SettingsError("; ".join(problems))
    return overrides


def _change(name: str, value: Any, settings_file: Path | None, overrides: Mapping[str, Any]) -> str:
    """How to give ``name`` the value ``value``: the file and the flag, or only the flag when a flag
    set it (a flag wins over the file, so editing the file would change nothing)."""
    if name in overrides:
        return f"this node was started with {flag(name, overrides[name])}: start it with {flag(name, value)}"
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    where = f" in {settings_file}" if settings_file is not None else ""
    return f"set {name} = {shown}{where}, or start the node with {flag(name, value)}"


def hint_for(
    decision: Decision | None,
    *,
    gpu: bool,
    settings_file: Path | None,
    overrides: Mapping[str, Any] | None = None,
) -> str | None:
    """For a waiting node: which setting (and flag) would let it work. None while it works, or when the
    volunteer chose the wait (paused, snoozed)."""
    if decision is None:
        return None
    given = overrides or {}
    code = decision.reason_code
    idle = "gpu_only_when_idle" if gpu else "only_when_idle"
    if code is Reason.IDLE_UNKNOWN:
        return (
            "Nothing here tells whether someone is using this computer (no display), so a node that works "
            "only when it is idle waits for good. To work regardless: "
            f"{_change(idle, False, settings_file, given)}."
        )
    if code is Reason.USER_ACTIVE:
        return f"To work while someone uses this computer: {_change(idle, False, settings_file, given)}."
    if code is Reason.CPU_BUSY:
        change = _change("pause_when_other_cpu_percent", 0, settings_file, given)
        return f"To work beside busy programs: {change}."
    if code is Reason.GPU_BUSY:
        return f"To share the GPU: {_change('pause_when_other_gpu_percent', 0, settings_file, given)}."
    if code is Reason.DATA_CAP_REACHED:
        return f"To lift the cap: {_change('monthly_data_cap_mib', 0, settings_file, given)} (0: none)."
    where = f" in {settings_file}" if settings_file is not None else ""
    if code is Reason.ON_BATTERY:
        return f"To work on battery: set run_on_battery = true{where}."
    if code is Reason.OUTSIDE_SCHEDULE:
        return f"The allowed hours are the [schedule] table{where}."
    if code is Reason.TOO_HOT:
        return f"The GPU's ceiling is gpu_max_temperature_c{where}."
    return None


class NodeLog:
    """What the node says: on the console as ever, and in its home's log file (rotated) when it has one.
    Library warnings (and with ``-v`` everything logged) go to the file too."""

    def __init__(self, log_file: Path | None) -> None:
        self.log_file = log_file
        self._logger = logging.getLogger("lah.node")
        self._handler: logging.Handler | None = None
        if log_file is None:
            return
        log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handler = logging.handlers.RotatingFileHandler(log_file, maxBytes=1 << 20, backupCount=3)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._handler = handler
        self._logger.propagate = False  # printed already: not once more by the console's handler
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(handler)
        logging.getLogger().addHandler(handler)

    def say(self, text: str) -> None:
        print(text, flush=True)
        if self._handler is not None:
            self._logger.info(text)

    def warn(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)
        if self._handler is not None:
            self._logger.warning(text)

    def close(self) -> None:
        handler, self._handler = self._handler, None
        if handler is not None:
            self._logger.removeHandler(handler)
            logging.getLogger().removeHandler(handler)
            handler.close()
