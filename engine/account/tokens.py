"""Where the account token lives: the OS keyring in the product, memory or a 0600 file in tests.

A :class:`TokenStore` maps a key (the coordinator's URL) to a string; the node stores its
:class:`Credentials` there as JSON. Tokens are bearer secrets, so the file store creates its file with
mode 0600 and the keyring store never writes anything to disk itself.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from engine.files import atomic_write

logger = logging.getLogger(__name__)

KEYRING_SERVICE = "learning-at-home"


@dataclass(frozen=True)
class Credentials:
    account_id: int
    token: str
    expires_at: float

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, text: str) -> Credentials | None:
        """``None`` for anything that is not a credentials record (so a bad entry means "register again")."""
        try:
            raw = json.loads(text)
            return cls(int(raw["account_id"]), str(raw["token"]), float(raw["expires_at"]))
        except (ValueError, KeyError, TypeError):
            return None


class TokenStore(Protocol):
    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str) -> None: ...


class MemoryTokenStore:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class FileTokenStore:
    """One JSON object in a file only the owner can read (mode 0600, written atomically)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, str]:
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def get(self, key: str) -> str | None:
        return self._read().get(key)

    def set(self, key: str, value: str) -> None:
        data = self._read()
        data[key] = value
        atomic_write(self.path, json.dumps(data).encode(), private=True)


class KeyringTokenStore:
    """The OS keyring (Windows Credential Locker, macOS Keychain, Secret Service) via ``keyring``."""

    def __init__(self, service: str = KEYRING_SERVICE) -> None:
        import keyring  # imported here: tests and headless tools need not have a keyring backend

        self._keyring = keyring
        self.service = service

    def get(self, key: str) -> str | None:
        value = self._keyring.get_password(self.service, key)
        return value if isinstance(value, str) else None

    def set(self, key: str, value: str) -> None:
        self._keyring.set_password(self.service, key, value)


def keyring_place(backend: object | None = None) -> str:
    """Where the keyring keeps what it is given, in words a person can check. A keyrings.alt backend is a
    file in the user's folder (in plain text, for PlaintextKeyring), not the system's keyring, and the
    volunteer is told which file; a chain of backends stores in its first."""
    if backend is None:
        import keyring

        backend = keyring.get_keyring()
    chain = getattr(backend, "backends", None)
    if isinstance(chain, list | tuple) and chain:
        backend = chain[0]
    name = type(backend).__name__
    path = getattr(backend, "file_path", None)
    if isinstance(path, str) and path:
        package = ".".join(type(backend).__module__.split(".")[:2])
        kind = "a plain-text key file" if "plaintext" in name.lower() else "a key file"
        return f"{kind}, {path} ({package} {name}: a file of its own, not your system's keyring)"
    return f"your system's keyring ({name})"


def default_token_store(
    data_dir: Path, *, service: str = KEYRING_SERVICE, file_name: str = "token.json"
) -> KeyringTokenStore | FileTokenStore:
    """The OS keyring where there is one; else a 0600 file in the data dir (headless Linux has no
    keyring backend, and a volunteer's node must still start there). ``service``/``file_name``: a
    trainer's (``lah train``) are its own, so the two never overwrite each other's token."""
    try:
        import keyring
        from keyring.backends import fail

        if not isinstance(keyring.get_keyring(), fail.Keyring):
            return KeyringTokenStore(service)
    except Exception as e:  # a broken backend is as good as none
        logger.warning("no usable OS keyring (%s); keeping the token in a private file", e)
    return FileTokenStore(data_dir / file_name)
