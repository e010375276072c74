"""One app per user: the first copy listens on a local socket; a second copy asks it to come forward
and exits. A socket left by a crashed copy is removed before listening."""

from __future__ import annotations

import getpass
import hashlib

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

CONNECT_TIMEOUT_MS = 1000


def instance_name(scope: str) -> str:
    """Per user and per config folder (so test runs and the demo, with their own folders, are apart)."""
    digest = hashlib.sha256(f"{getpass.getuser()}\0{scope}".encode()).hexdigest()[:16]
    return f"learning-at-home-{digest}"


class SingleInstance(QObject):
    activated = Signal()  # another copy was started: bring the window forward

    def __init__(self, scope: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = instance_name(scope)
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self.server.newConnection.connect(self._on_connection)

    def claim(self) -> bool:
        """True: this is the first copy (now listening). False: another copy was told to come forward."""
        probe = QLocalSocket()
        probe.connectToServer(self.name)
        if probe.waitForConnected(CONNECT_TIMEOUT_MS):
            probe.write(b"show\n")
            probe.waitForBytesWritten(CONNECT_TIMEOUT_MS)
            probe.disconnectFromServer()
            return False
        QLocalServer.removeServer(self.name)  # stale, from a copy that crashed
        if not self.server.listen(self.name):
            raise OSError(f"cannot listen on {self.name}: {self.server.errorString()}")
        return True

    def _on_connection(self) -> None:
        while (sock := self.server.nextPendingConnection()) is not None:
            sock.readyRead.connect(lambda s=sock: self._read(s))
            sock.disconnected.connect(sock.deleteLater)
            if sock.bytesAvailable():
                self._read(sock)

    def _read(self, sock: QLocalSocket) -> None:
        if bytes(sock.readAll().data()).startswith(b"show"):
            self.activated.emit()

    def close(self) -> None:
        self.server.close()
