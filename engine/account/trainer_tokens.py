"""Where a trainer account's token is kept: the OS keyring, under a service of its own.

``lah train login`` stores it here, and both ``lah train`` and a researcher's own script
(:mod:`engine.swarm`) read it from here, so one login serves both. The volunteer's node keeps its token
under ``learning-at-home`` (:mod:`.tokens`); a trainer's lives under ``learning-at-home-trainer`` (file
fallback ``trainer-token.json``), keyed by the coordinator's URL, so one person may volunteer and train
from one computer. The policy is the node's and the tray app's (``.tokens.default_token_store``): the
keyring where there is a usable one, a 0600 file in the data dir where there is none, and the same file
where the keyring refuses to store (locked, no permission), saying so. Reads look in the keyring, then
the file. Nothing here prints or logs a token.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from .tokens import (
    Credentials,
    FileTokenStore,
    KeyringTokenStore,
    TokenStore,
    default_token_store,
    keyring_place,
)

if TYPE_CHECKING:  # light at import: ``lah train login`` loads neither torch nor aiohttp for this
    from .coordinator_api import CoordinatorApi

__all__ = [
    "KEYRING_SERVICE",
    "START_REFRESH_S",
    "TOKEN_FILE",
    "TrainerCredentials",
    "default_trainer_dir",
    "fresh",
    "token_key",
]

logger = logging.getLogger(__name__)

KEYRING_SERVICE = "learning-at-home-trainer"
TOKEN_FILE = "trainer-token.json"
#: Refreshed at start when less than this is left (a run then refreshes within the last hour itself).
START_REFRESH_S = 6 * 3600.0


def default_trainer_dir() -> Path:
    """A trainer's identity, lock and (without a keyring) token: the user data dir's ``trainer``."""
    from engine.p2p.identity import APP_NAME

    return Path(platformdirs.user_data_dir(APP_NAME)) / "trainer"


def token_key(coordinator_url: str) -> str:
    return coordinator_url.rstrip("/")


class TrainerCredentials:
    """The trainer's token per coordinator: ``token_file`` (a 0600 file) if given, else keyring or file."""

    def __init__(
        self, data_dir: Path, token_file: Path | None = None, *, service: str = KEYRING_SERVICE
    ) -> None:
        self.file = FileTokenStore(token_file or data_dir / TOKEN_FILE)
        self.store: TokenStore = (
            self.file
            if token_file is not None
            else default_token_store(data_dir, service=service, file_name=TOKEN_FILE)
        )

    @property
    def place(self) -> str:
        """Where the token is kept, in words (the keyring's class, or the file's path)."""
        if isinstance(self.store, KeyringTokenStore):
            return keyring_place()  # a keyrings.alt file is named as the file it is
        return f"the private file {self.file.path}"

    def load(self, coordinator_url: str) -> Credentials | None:
        key = token_key(coordinator_url)
        raw: str | None = None
        if self.store is not self.file:
            try:
                raw = self.store.get(key)
            except Exception as e:  # a locked keyring, dbus gone: the file may hold it
                logger.warning(
                    "the keyring could not be read (%s); looking in %s", type(e).__name__, self.file.path
                )
        if raw is None:
            raw = self.file.get(key)
        return Credentials.loads(raw) if raw else None

    def save(self, coordinator_url: str, credentials: Credentials) -> str:
        """Keep ``credentials``; returns where, in words. A keyring that refuses falls back to the file."""
        key = token_key(coordinator_url)
        if self.store is not self.file:
            try:
                self.store.set(key, credentials.dumps())
                return self.place
            except Exception as e:  # KeyringLocked, PasswordSetError, dbus errors...
                logger.warning(
                    "the keyring refused the token (%s); using %s", type(e).__name__, self.file.path
                )
                self.store = self.file
        self.file.set(key, credentials.dumps())
        return self.place


async def fresh(api: CoordinatorApi, store: TrainerCredentials, credentials: Credentials) -> Credentials:
    """``credentials``, refreshed (and kept) when less than ``START_REFRESH_S`` of the token is left.
    The refresh revokes the old token, so the new one is stored before anything else uses it."""
    if credentials.expires_at - time.time() >= START_REFRESH_S:
        return credentials
    new = await api.refresh(credentials)
    store.save(api.url, new)
    return new
