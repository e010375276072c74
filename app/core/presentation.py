"""What the tray shows for a given moment: icon, one-line status and tooltip. Pure, so it is tested
without a screen, and the tray, the fallback window and the status window all say the same thing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ICONS = ("contributing", "waiting", "paused", "snoozed", "error", "starting")


@dataclass(frozen=True)
class View:
    icon: str  # one of ICONS: assets/icons/tray-<icon>.svg
    headline: str  # short: the menu's status line
    reason: str  # a sentence: the tooltip and the status window
    paused: bool  # whether the menu offers Resume rather than Pause


def present(status: dict[str, Any] | None, supervisor: str, supervisor_text: str, connected: bool) -> View:
    """``supervisor``: NodeSupervisor's state; ``connected``: whether the control API answers."""
    if supervisor == "gave_up":
        return View("error", "Stopped: the engine keeps failing", supervisor_text, True)
    if supervisor == "restarting":
        return View("error", "Restarting the engine", supervisor_text, False)
    if status is None or not connected:
        text = (
            supervisor_text
            if supervisor in ("starting", "stopped")
            else "Connecting to the contribution engine…"
        )
        return View("starting", "Starting…", text, False)
    state = str(status.get("state"))
    reason = str(status.get("reason") or "")
    if state == "running":
        n = len(status.get("experts") or [])
        return View(
            "contributing", "Contributing", f"Hosting {n} expert{'s' * (n != 1)}. {_cap(reason)}", False
        )
    if state == "paused":
        return View("paused", "Paused", "Paused by you. Choose Resume to contribute again.", True)
    if state == "snoozed":
        return View("snoozed", "Snoozed", _cap(reason) or "Snoozed.", True)
    if state == "waiting":
        return View("waiting", "Waiting", _cap(reason) or "Waiting.", False)
    if state == "starting":
        errors = status.get("errors") or []
        if errors:
            return View("error", "Cannot reach the project", _cap(str(errors[-1].get("message", ""))), False)
        return View("starting", "Joining the swarm…", _cap(reason) or "Joining the swarm.", False)
    return View("starting", _cap(state), _cap(reason), False)


def _cap(text: str) -> str:
    text = text.strip()
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?", "…")) else text + "."


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
