"""The tray app as one more volunteer of ``lah demo --app``: a real ``lah app`` process in folders of
its own inside the demo's temporary directory, so a newcomer's real settings, keyring and autostart
are never touched, pinned to loopback like the rest of the demo swarm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def user_folders(root: Path) -> dict[str, str]:
    """XDG variables that give a user of their own under ``root`` (config, data, logs, runtime; 0700)."""
    env = {}
    for var, sub in (
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_STATE_HOME", "state"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_RUNTIME_DIR", "run"),
    ):
        path = root / sub
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        env[var] = str(path)
    return env


def app_environment(folder: Path) -> dict[str, str]:
    # its node talks to the demo's volunteers on loopback only
    return {**os.environ, **user_folders(folder), "LAH_HOST_ADDRESSES": "127.0.0.1"}


def launch_app(coordinator_url: str, folder: Path) -> subprocess.Popen[bytes]:
    """Start the tray app on the demo's coordinator; its first-run window opens for the newcomer."""
    env = app_environment(folder)
    log = (folder / "app-console.log").open("ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "lah", "app", "--coordinator", coordinator_url, "--demo"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    finally:
        log.close()


def stop_app(proc: subprocess.Popen[bytes], timeout: float = 45.0) -> None:
    """Ask it to quit as Quit does (it stops its node cleanly), then make sure."""
    if proc.poll() is not None:
        return
    proc.terminate()  # the app turns SIGTERM into Quit
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
