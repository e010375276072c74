"""The app's own settings (``app.toml`` in the user config folder), apart from the node's limits.

The node's limits stay in the engine's ``settings.toml`` (the node reads them; the app changes them
through ``set_limits`` while the node runs). Here is what only the app needs: whether the volunteer has
consented, the coordinator, the name and team shown on the leaderboard, autostart, and what the app
has already told the user once. Loading repairs field by field with the engine's loader, keeps the
damaged file beside it and says which field it repaired; saving is atomic and raises ``ConfigError``
(a full disk loses nothing: the previous file stays as it was).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

import msgspec
import platformdirs
import tomli_w

from engine.files import atomic_write
from engine.resources.settings import keep_backup, load_fields

from .errors import ConfigError

APP_NAME = "learning-at-home"
# The project's public coordinator; `lah app --coordinator URL` and the wizard can change it.
DEFAULT_COORDINATOR_URL = "https://coordinator.learning-at-home.org"
MAX_NAME = 64

Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME)]


class AppConfig(msgspec.Struct, frozen=True, kw_only=True):
    consented: bool = False
    consented_at: str = ""  # ISO time of "Start contributing"
    coordinator_url: Annotated[str, msgspec.Meta(pattern=r"^https?://\S+$")] = DEFAULT_COORDINATOR_URL
    display_name: Name = ""
    team: Name = ""
    account_id: Annotated[int, msgspec.Meta(ge=0)] = 0  # for the contributor page link; 0 = unknown
    autostart: bool = True
    token_file: str = ""  # where the token is when the keyring could not take it (the node's --token-file)
    no_tray_noted: bool = False  # the "no tray here, a window instead" notice was shown
    credit_milestone: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # the last milestone announced


def config_dir() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def config_path() -> Path:
    return config_dir() / "app.toml"


def load_config(path: Path | None = None) -> tuple[AppConfig, list[str]]:
    """The app's settings and plain messages for each field that had to be repaired."""
    path = path or config_path()
    try:
        text = path.read_bytes().decode("utf-8")
        raw = tomllib.loads(text)
    except FileNotFoundError:
        return AppConfig(), []
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        warnings = [f"The app's settings file could not be read ({e}); starting from the defaults."]
        raw = None
    else:
        warnings = []
    config = AppConfig() if raw is None else load_fields(AppConfig, raw, "", warnings)
    if warnings:
        try:
            warnings.append(f"The original file was kept as {keep_backup(path).name}.")
            save_config(config, path)
        except (OSError, ConfigError) as e:
            warnings.append(f"The repaired settings could not be written ({e}).")
    assert isinstance(config, AppConfig)
    return config, warnings


def save_config(config: AppConfig, path: Path | None = None) -> None:
    try:
        atomic_write(path or config_path(), tomli_w.dumps(msgspec.to_builtins(config)).encode())
    except OSError as e:
        raise ConfigError(f"Could not save the app's settings ({e.strerror or e}).") from e
