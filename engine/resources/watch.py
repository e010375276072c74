"""A running node's settings: the file it watches, and the limits its command line sets on top.

Every node re-reads its settings file when its content changes (an editor, the tray app, ``set_limits``
of another node sharing the file), so several nodes watching one file all follow it. The file is read
every ``interval`` seconds and compared byte for byte: a settings file is a few hundred bytes, and
unlike a modification time the content cannot look unchanged after a quick edit, an edit within the
file system's timestamp resolution, or a rename over it.

Command-line limits (``lah node --only-when-idle=false`` ...) are overrides: applied on top of whatever
the file says, at start and after every reload, and never written into the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from .errors import SettingsError
from .settings import Settings, load_settings, validated

log = logging.getLogger(__name__)

OnChange = Callable[[Settings, list[str]], None]

__all__ = ["SettingsWatcher", "apply_overrides", "format_overrides"]


def apply_overrides(settings: Settings, overrides: Mapping[str, Any]) -> Settings:
    """``settings`` with ``overrides`` in place of the file's values; SettingsError names any bad one."""
    if not overrides:
        return settings
    known = set(msgspec.structs.asdict(settings))
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise SettingsError(f"Unknown setting(s): {', '.join(unknown)}.")
    try:
        return validated(msgspec.structs.replace(settings, **overrides))
    except TypeError as e:  # a value msgspec cannot even place in the struct
        raise SettingsError(str(e)) from None


def format_overrides(overrides: Mapping[str, Any]) -> str:
    """``only_when_idle=false, cpu_max_percent=80``: as the settings file would spell them."""
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items())


class SettingsWatcher:
    def __init__(self, path: Path, on_change: OnChange, *, interval: float = 2.0) -> None:
        """``on_change(settings, warnings)``: the file's new settings (before any overrides) and what had to
        be repaired in it; called on the event loop, once per change of content."""
        self.path = path
        self.on_change = on_change
        self.interval = interval
        self.reloads = 0
        self._seen = self._read()
        self._task: asyncio.Task[None] | None = None

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def check(self) -> tuple[Settings, list[str]] | None:
        """Load the file if its content changed since the last look (or since the watcher was made: the
        node has just loaded it). A missing file is no change: editors delete and rewrite, and a node
        keeps the limits it has rather than falling back to the defaults."""
        data = self._read()
        if data is None or data == self._seen:
            return None
        self._seen = data  # a repair rewrites the file: the next look loads that once more, unchanged
        self.reloads += 1
        return load_settings(self.path)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                changed = await asyncio.to_thread(self.check)  # a repair fsyncs: off the loop
            except Exception:
                log.exception("reading %s failed; trying again", self.path)
                continue
            if changed is not None:
                try:
                    self.on_change(*changed)
                except Exception:
                    log.exception("applying the reloaded settings failed")

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="settings-watch")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
