"""A stand-in for GNOME's idle monitor on a private session bus: ``org.gnome.Mutter.IdleMonitor``
answering ``GetIdletime`` with the milliseconds given on the command line (run by the D-Bus test)."""

from __future__ import annotations

import sys

from PySide6.QtCore import QCoreApplication, QObject, Slot
from PySide6.QtDBus import QDBusConnection


class IdleMonitor(QObject):
    def __init__(self, idle_ms: int) -> None:
        super().__init__()
        self.idle_ms = idle_ms

    @Slot(result="qulonglong")
    def GetIdletime(self) -> int:
        return self.idle_ms


def main() -> int:
    app = QCoreApplication(sys.argv)
    bus = QDBusConnection.sessionBus()
    monitor = IdleMonitor(int(sys.argv[1]))
    options = QDBusConnection.RegisterOption.ExportAllSlots
    if not bus.registerObject(
        "/org/gnome/Mutter/IdleMonitor/Core", "org.gnome.Mutter.IdleMonitor", monitor, options
    ):
        return 3
    if not bus.registerService("org.gnome.Mutter.IdleMonitor"):
        return 4
    print("ready", flush=True)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
