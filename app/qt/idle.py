"""The user's idle time as this desktop session sees it, for the node (``feed_idle``).

Windows and macOS: the engine's readers (in the user's session, where they work). Linux: the X11
counter under X; under Wayland the desktop's D-Bus idle service (GNOME's Mutter IdleMonitor, else the
freedesktop ScreenSaver interface that KDE implements), called with a short timeout. Readers run on
the app's loop thread (``NodeLink``), never on the GUI thread.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from engine.resources import IdleReading, IdleSource, UnknownIdle, X11Idle, default_idle_source

DBUS_TIMEOUT_MS = 500

# (service, object path, interface, method): each answers milliseconds since the last input.
DBUS_IDLE_SERVICES = (
    (
        "org.gnome.Mutter.IdleMonitor",
        "/org/gnome/Mutter/IdleMonitor/Core",
        "org.gnome.Mutter.IdleMonitor",
        "GetIdletime",
    ),
    (
        "org.freedesktop.ScreenSaver",
        "/org/freedesktop/ScreenSaver",
        "org.freedesktop.ScreenSaver",
        "GetSessionIdleTime",
    ),
)


class DBusIdle:
    """Idle time from the desktop's D-Bus service: the first of ``DBUS_IDLE_SERVICES`` that answers."""

    def __init__(self, services: tuple[tuple[str, str, str, str], ...] = DBUS_IDLE_SERVICES) -> None:
        self.services = services
        self._working: tuple[str, str, str, str] | None = None

    def _ask(self, service: tuple[str, str, str, str]) -> float | None:
        from PySide6.QtDBus import QDBusConnection, QDBusInterface, QDBusMessage

        bus = QDBusConnection.sessionBus()
        if not bus.isConnected():
            return None
        name, path, interface, method = service
        iface = QDBusInterface(name, path, interface, bus)
        iface.setTimeout(DBUS_TIMEOUT_MS)
        reply = iface.call(method)
        if reply.type() != QDBusMessage.MessageType.ReplyMessage or not reply.arguments():
            return None
        value = reply.arguments()[0]
        return float(value) / 1000.0 if isinstance(value, int | float) and value >= 0 else None

    def read(self) -> IdleReading:
        for service in (self._working,) if self._working else self.services:
            assert service is not None
            seconds = self._ask(service)
            if seconds is not None:
                self._working = service
                return IdleReading(seconds)
        self._working = None
        return IdleReading(None, "the desktop offers no idle-time service on D-Bus")

    def close(self) -> None:
        pass


def session_idle_reader(
    environ: dict[str, str] | None = None, platform: str = sys.platform
) -> tuple[Callable[[], IdleReading], str]:
    """The reader for this session and the source name the node will show (``app:x11`` ...)."""
    env = os.environ if environ is None else environ
    source: IdleSource
    if platform.startswith("linux") and (
        env.get("WAYLAND_DISPLAY") or env.get("XDG_SESSION_TYPE") == "wayland"
    ):
        source, name = DBusIdle(), "app:dbus"
    else:
        source = default_idle_source(dict(env), platform)
        name = {"win32": "app:windows", "darwin": "app:macos"}.get(platform, "app:x11")
        if isinstance(source, UnknownIdle):
            name = "app:none"
        elif isinstance(source, X11Idle):
            name = "app:x11"
    return source.read, name
