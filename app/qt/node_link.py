"""NodeLink: the app's only way to the node, its local control API, run on the app's loop thread.

One connection follows ``status`` (re-established with back-off whenever the node restarts, its
connection file is stale or its secret changed); a second one carries commands, so a pause is never
queued behind a status stream. Results and updates reach widgets as Qt signals on the GUI thread.
While connected it also feeds the user's idle time as this session sees it (``feed_idle``), once a
second, so the node yields even where it cannot watch the keyboard itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.control import ControlClient, ControlError, default_connection_path
from engine.resources import IdleReading

from .bridge import Bridge, Done

log = logging.getLogger(__name__)

IdleReader = Callable[[], tuple[IdleReading, str]]  # the reading and its source's name


class NodeLink(QObject):
    status_changed = Signal(dict)
    connected_changed = Signal(bool, str)  # connected?, why not

    def __init__(
        self,
        bridge: Bridge,
        path: Path | None = None,
        *,
        idle_reader: IdleReader | None = None,
        timeout: float = 5.0,
        idle_period_s: float = 1.0,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.path = path or default_connection_path()
        self.timeout = timeout
        self.idle_reader = idle_reader
        self.idle_period_s = idle_period_s
        self.connected = False
        self.last_status: dict[str, Any] | None = None
        self._commands: ControlClient | None = None  # lives on the loop thread
        self._lock: asyncio.Lock | None = None
        self._tasks: list[Any] = []

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [self.bridge.submit(self._follow())]
            if self.idle_reader is not None:
                self._tasks.append(self.bridge.submit(self._feed_idle()))

    def stop(self) -> None:
        for future in self._tasks:
            future.cancel()
        self._tasks = []

    def command(self, cmd: str, on_done: Done | None = None, **args: Any) -> None:
        """Send ``cmd`` off the GUI thread; ``on_done(result, error)`` comes back on it."""
        self.bridge.submit(self._command(cmd, args), on_done)

    # -- on the loop thread ---------------------------------------------------------------------------

    def _set_connected(self, connected: bool, why: str = "") -> None:
        if connected != self.connected or (not connected and why):
            self.connected = connected
            self.connected_changed.emit(connected, why)

    async def _follow(self) -> None:
        delay = 0.25
        while True:
            try:
                async with ControlClient(self.path, timeout=self.timeout) as client:
                    self._set_connected(True)
                    delay = 0.25
                    async for status in client.follow_status(idle_timeout=3 * self.timeout):
                        self.last_status = status
                        self.status_changed.emit(status)
                why = "the node closed the connection"
            except (ControlError, OSError, TimeoutError) as e:
                why = e.message if isinstance(e, ControlError) else f"{type(e).__name__}: {e}"
            self._set_connected(False, why)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _command(self, cmd: str, args: dict[str, Any]) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            for attempt in (1, 2):  # a fresh connection once, if the node restarted since the last one
                try:
                    if self._commands is None:
                        client = ControlClient(self.path, timeout=self.timeout)
                        await client.connect()
                        self._commands = client
                    return await self._commands.request(cmd, **args)
                except ControlError as e:
                    if e.code not in ("disconnected", "not_running", "not_connected") or attempt == 2:
                        raise
                    await self._drop_commands()
                except (OSError, TimeoutError) as e:
                    await self._drop_commands()
                    if attempt == 2:
                        raise ControlError("not_running", f"the node does not answer: {e}") from e
        raise AssertionError("unreachable")

    async def _drop_commands(self) -> None:
        client, self._commands = self._commands, None
        if client is not None:
            await client.close()

    async def _feed_idle(self) -> None:
        assert self.idle_reader is not None
        while True:
            await asyncio.sleep(self.idle_period_s)
            if not self.connected:
                continue
            reading, source = await asyncio.to_thread(self.idle_reader)
            if reading.seconds is None:
                continue
            with contextlib.suppress(ControlError, OSError, TimeoutError):
                await self._command("feed_idle", {"seconds": reading.seconds, "source": source})
