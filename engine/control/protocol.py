"""The control protocol's framing, errors and the connection file (port + secret, mode 0600).

JSON lines over a localhost TCP socket. The first line a client sends is ``{"auth": <secret>}``; the server
answers ``{"ok": true}`` or ``{"ok": false, "error": "unauthorized", ...}`` and hangs up. After that each
request is ``{"id": n, "cmd": ..., ...args}`` and each reply ``{"id": n, "ok": true, "result": ...}`` or
``{"id": n, "ok": false, "error": code, "message": text}``; ``status`` with ``"follow": true`` sends
``{"id": n, "event": "status", "status": {...}}`` lines until the client hangs up.

The secret lives in the connection file in the node's home (``engine.node.home``: the user's runtime,
else config, folder, or the node's ``--data-dir``), created with mode 0600 in a folder of mode 0700 (a
folder found with wider permissions is narrowed; on Windows the folder is already per-user): whoever can
read it is the user who started the node.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.files import atomic_write
from engine.node.home import runtime_dir, user_data_dir

APP_NAME = "learning-at-home"
CONNECTION_FILE = "control.json"
MAX_LINE = 64 * 1024
AUTH_TIMEOUT_S = 3.0  # the first line (the secret) must arrive by then, or the server hangs up


class ControlError(Exception):
    """A control request failed; ``code`` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Unauthorized(ControlError):
    def __init__(self, message: str = "wrong or missing secret") -> None:
        super().__init__("unauthorized", message)


class NodeNotRunning(ControlError):
    def __init__(self, message: str) -> None:
        super().__init__("not_running", message)


def default_dir() -> Path:
    """The default node home's runtime folder (``engine.node.home``); a ``--data-dir`` node uses its own."""
    return runtime_dir()


def private_dir(path: Path) -> Path:
    """Create ``path`` (0700), or narrow it to 0700 if it exists with wider permissions (POSIX)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.name == "posix":
        info = path.stat()
        if info.st_uid != os.getuid():
            raise ControlError("insecure_dir", f"{path} belongs to another user")
        if stat.S_IMODE(info.st_mode) & 0o077:
            path.chmod(0o700)
    return path


def data_dir() -> Path:
    """The default node's identity, token file, checkpoints and traffic counter (the tray app uses it too)."""
    return user_data_dir()


def default_connection_path() -> Path:
    return default_dir() / CONNECTION_FILE


@dataclass(frozen=True)
class ConnectionInfo:
    host: str
    port: int
    secret: str
    pid: int

    @staticmethod
    def new_secret() -> str:
        return secrets.token_hex(32)

    def write(self, path: Path) -> None:
        """Atomically, and never readable by others for an instant (the temp file is 0600 from creation)."""
        private_dir(path.parent)
        info = {"host": self.host, "port": self.port, "secret": self.secret, "pid": self.pid}
        atomic_write(path, json.dumps(info).encode(), private=True)

    @classmethod
    def read(cls, path: Path) -> ConnectionInfo:
        try:
            raw = json.loads(path.read_text())
            return cls(str(raw["host"]), int(raw["port"]), str(raw["secret"]), int(raw["pid"]))
        except FileNotFoundError:
            raise NodeNotRunning(
                f"no volunteer node is running (no {path}); start one with `lah node`"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise NodeNotRunning(f"cannot read the node's connection file {path}: {e}") from e


def file_mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise ControlError("bad_request", f"not JSON: {e}") from e
    if not isinstance(obj, dict):
        raise ControlError("bad_request", "each line must be a JSON object")
    return obj
