"""One node per user: a lock file holding the owner's PID, created exclusively; a dead owner's lock is stale.

``acquire`` creates the file with ``O_EXCL``. If it exists and its PID is alive (and is not us), it raises
:class:`AlreadyRunning` with that PID; if the PID is gone or the file is unreadable, the stale lock is
removed and taken over. ``release`` removes the file only if it is still ours.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from .errors import AlreadyRunning


class InstanceLock:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.held = False

    def owner(self) -> int | None:
        """The live PID holding the lock, or None."""
        try:
            pid = int(self.path.read_text().strip() or "0")
        except (OSError, ValueError):
            return None
        if pid <= 0 or not psutil.pid_exists(pid):
            return None
        return pid

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pid = self.owner()
                if pid is not None and pid != os.getpid():
                    raise AlreadyRunning(pid, str(self.path)) from None
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()  # stale: its process is gone (or it is our own leftover)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self.held = True
            return
        raise AlreadyRunning(self.owner() or -1, str(self.path))

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        if self.owner() == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def __enter__(self) -> InstanceLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
