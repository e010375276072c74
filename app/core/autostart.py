"""Start the app at login: a Windows ``Run`` value, a macOS LaunchAgent, or an XDG autostart entry.

Written only after consent (and removed when the volunteer turns it off), never by an installer. The
command is the program as it runs now: the bundle's executable, or this Python with ``-m lah app``.
"""

from __future__ import annotations

import contextlib
import os
import plistlib
import shlex
import subprocess
import sys
from pathlib import Path

from engine.files import atomic_write

ENTRY = "learning-at-home"
RUN_VALUE = "Learning@home"  # the Windows Run value; the uninstaller (installers/windows) removes it
MAC_LABEL = "org.learning-at-home.app"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"


def app_command() -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "lah", "app"]


def xdg_entry_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "autostart" / f"{ENTRY}.desktop"


def xdg_entry(command: list[str]) -> str:
    return (
        "[Desktop Entry]\n"
        "Type=Application\n"
        "Name=Learning@home\n"
        "Comment=Lend this computer's idle GPU to train neural networks together\n"
        f"Exec={shlex.join(command)}\n"
        "Icon=learning-at-home\n"
        "Terminal=false\n"
        "X-GNOME-Autostart-enabled=true\n"
    )


def mac_agent_path() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / f"{MAC_LABEL}.plist"


def mac_agent(command: list[str]) -> bytes:
    return plistlib.dumps(
        {"Label": MAC_LABEL, "ProgramArguments": command, "RunAtLoad": True, "ProcessType": "Interactive"}
    )


def windows_command_line(command: list[str]) -> str:
    return subprocess.list2cmdline(command)


def _windows_run_key(enabled: bool | None, command: list[str]) -> bool:
    """Set (True), remove (False) or read (None) the ``Run`` value; returns whether it exists after."""
    if sys.platform != "win32":
        raise OSError("the Run key exists only on Windows")
    import winreg

    access = winreg.KEY_READ if enabled is None else winreg.KEY_SET_VALUE
    with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, access) as key:
        if enabled is None:
            try:
                winreg.QueryValueEx(key, RUN_VALUE)
                return True
            except FileNotFoundError:
                return False
        if enabled:
            winreg.SetValueEx(key, RUN_VALUE, 0, winreg.REG_SZ, windows_command_line(command))
        else:
            with contextlib.suppress(FileNotFoundError):
                winreg.DeleteValue(key, RUN_VALUE)
        return enabled


def set_enabled(enabled: bool, command: list[str] | None = None, platform: str = sys.platform) -> None:
    """Raises OSError when the entry cannot be written or removed."""
    command = command or app_command()
    if platform == "win32":
        _windows_run_key(enabled, command)
        return
    path, content = (
        (mac_agent_path(), mac_agent(command))
        if platform == "darwin"
        else (xdg_entry_path(), xdg_entry(command).encode())
    )
    if enabled:
        atomic_write(path, content)
    else:
        path.unlink(missing_ok=True)


def is_enabled(platform: str = sys.platform) -> bool:
    if platform == "win32":
        try:
            return _windows_run_key(None, [])
        except OSError:
            return False
    return (mac_agent_path() if platform == "darwin" else xdg_entry_path()).exists()
