"""A keyring backend that behaves like a locked OS keyring (selected with PYTHON_KEYRING_BACKEND)."""

from __future__ import annotations

from keyring.backend import KeyringBackend
from keyring.errors import KeyringLocked


class LockedKeyring(KeyringBackend):
    priority = 1.0  # type: ignore[assignment]

    def get_password(self, service: str, username: str) -> str | None:
        return None

    def set_password(self, service: str, username: str, password: str) -> None:
        raise KeyringLocked("the keyring is locked")

    def delete_password(self, service: str, username: str) -> None:
        raise KeyringLocked("the keyring is locked")
