"""AppPaths: the four places the app keeps things, in one value, so a test (or ``--data-dir`` one day)
moves them all together and nothing reaches for the user's real folders by itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.control import data_dir
from engine.resources import settings_path

from .config import config_path


@dataclass(frozen=True)
class AppPaths:
    config: Path  # the app's own ``app.toml``
    settings: Path  # the node's limits (``settings.toml``), which the app writes before the node starts
    data: Path  # the node's data folder: token file, update state, downloads
    logs: Path  # ``app.log`` and ``node.log``

    @classmethod
    def default(cls) -> AppPaths:
        import platformdirs

        return cls(
            config_path(),
            settings_path(),
            data_dir(),
            Path(platformdirs.user_log_dir("learning-at-home", appauthor=False)),
        )
