"""Small helpers for the app tests: a consented volunteer's files, free ports, a full disk."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from app.core.config import AppConfig, save_config
from app.core.paths import AppPaths
from engine.control import ControlClient
from engine.resources import Settings, save_settings


def consented(coordinator_url: str, name: str = "Bo", **settings: object) -> AppPaths:
    """Write what the wizard writes, so a test starts where a returning volunteer does."""
    paths = AppPaths.default()
    save_config(
        AppConfig(consented=True, coordinator_url=coordinator_url, display_name=name, autostart=False),
        paths.config,
    )
    # a busy test machine must not make the node wait for "other programs" (0: never)
    limits = {"use_gpu": False, "only_when_idle": False, "pause_when_other_cpu_percent": 0, **settings}
    save_settings(Settings(**limits), paths.settings)  # type: ignore[arg-type]
    return paths


def node_state(control: Path | None = None) -> str | None:
    """The running node's state through its control API (``None``: no node answers)."""

    async def ask() -> str | None:
        try:
            async with ControlClient(control, timeout=5) as client:
                return str((await client.status())["state"])
        except Exception:
            return None

    return asyncio.run(ask())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def tiny_disk(folder: Path, size: str = "64k") -> Iterator[Path]:
    """A real, tiny file system (tmpfs; the tests run as root) mounted on ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True, timeout=10
    )
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=10)


def fill(folder: Path) -> None:
    """Write until the file system says it is full."""
    with contextlib.suppress(OSError), (folder / "filler").open("wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()
