"""First run: register the volunteer's account and keep its token where the node will find it.

The token goes to the OS keyring when there is a working one. Where there is none (headless Linux) or
it refuses (locked, no permission), it goes to the node's private 0600 file instead, the app says so on
screen, and the node is started with ``--token-file`` so both always look in the same place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from engine.account import (
    CoordinatorError,
    CoordinatorUnreachable,
    Credentials,
    FileTokenStore,
    KeyringTokenStore,
    default_token_store,
    keyring_place,
)

from .errors import RegistrationError

log = logging.getLogger(__name__)

TOKEN_FILE = "token.json"


@dataclass(frozen=True)
class TokenPlace:
    """Where the token will be kept, in words for the wizard, and the file when it is not the keyring."""

    description: str
    file: Path | None


def token_place(data_dir: Path) -> TokenPlace:
    store = default_token_store(data_dir)
    if isinstance(store, KeyringTokenStore):
        return TokenPlace(keyring_place(), None)
    path = data_dir / TOKEN_FILE
    return TokenPlace(
        f"a private file only your user account can read ({path}), because this computer has no keyring",
        path,
    )


def token_key(coordinator_url: str) -> str:
    """The key the node looks the token up by (``Volunteer.token_key``)."""
    return coordinator_url.rstrip("/")


def store_token(credentials: Credentials, coordinator_url: str, data_dir: Path) -> TokenPlace:
    """Keep the token; a keyring that refuses falls back to the private file (and says so)."""
    place = token_place(data_dir)
    key = token_key(coordinator_url)
    if place.file is None:
        try:
            KeyringTokenStore().set(key, credentials.dumps())
            return place
        except Exception as e:  # keyring raises KeyringLocked, PasswordSetError, dbus errors...
            log.warning("the keyring refused the token (%s); using a private file", e)
            path = data_dir / TOKEN_FILE
            place = TokenPlace(
                f"a private file only your user account can read ({path}), because the keyring refused "
                f"it ({type(e).__name__})",
                path,
            )
    assert place.file is not None
    FileTokenStore(place.file).set(key, credentials.dumps())
    return place


async def register(
    coordinator_url: str, name: str, team: str, data_dir: Path, *, invite: str = "", timeout: float = 15.0
) -> tuple[Credentials, TokenPlace]:
    """Create the account and keep its token. Raises RegistrationError with a sentence for the volunteer.

    ``invite``: the invitation code, where the project admits only the names it invited."""
    from engine.account.coordinator_api import CoordinatorApi  # aiohttp: loaded for the first run only

    api = CoordinatorApi(token_key(coordinator_url), timeout=timeout)
    try:
        credentials = await api.register(name, team or None, invite or None)
    except CoordinatorUnreachable as e:
        raise RegistrationError(
            f"The project's server at {coordinator_url} cannot be reached ({e}). Check the internet "
            "connection or the server address, then try again.",
            unreachable=True,
        ) from e
    except CoordinatorError as e:
        if e.status == 409:
            message = f"The name '{name}' is already taken. Please choose another one."
        elif e.code == "invite_invalid":
            message = (
                f"This project admits only the people it invited, and it has no open invitation for "
                f"'{name}' with that code. Check the name and the invitation code it sent you."
            )
        else:
            message = f"The project's server refused the registration: {e.message}"
        raise RegistrationError(message, unreachable=False) from e
    finally:
        await api.close()
    try:
        place = store_token(credentials, coordinator_url, data_dir)
    except OSError as e:
        raise RegistrationError(
            f"Your account was created, but its key could not be saved ({e.strerror or e}).",
            unreachable=False,
        ) from e
    return credentials, place
