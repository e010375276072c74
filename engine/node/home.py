"""A node's home: where one node keeps everything that is its own, so that nodes never share any of it.

Without ``--data-dir`` a node lives where it always has (``platformdirs``' per-user folders), so existing
installs and the tray app's node keep their identity, token and settings::

    node.lock, control.json   the runtime folder ($XDG_RUNTIME_DIR/learning-at-home, else the config folder)
    settings.toml             the user config folder
    identity.key, traffic.json, experts/   the user data folder (experts/: the checkpoints)
    the token                 the OS keyring, else token.json in the data folder
    the log                   standard output and error (the tray app writes them to its node.log)

With ``--data-dir DIR`` everything is in ``DIR`` (made 0700: it holds the key and the token), and a
second node with another ``DIR`` on the same machine and account shares nothing with the first::

    DIR/node.lock  DIR/control.json  DIR/settings.toml  DIR/identity.key  DIR/token.json (0600)
    DIR/traffic.json  DIR/logs/node.log  DIR/experts/ (checkpoints)

The token is a file there, not a keyring entry: the keyring has one entry per coordinator for the whole
user, and on a server it is usually absent or locked. (A home made before it held the token finds it in
the keyring once and keeps it in its file from then on: ``adopt_keyring_token``.) ``--settings`` and
``--token-file`` still name another file for one of them (several nodes may share one settings file on
purpose: each follows its edits).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import platformdirs

from engine.account.tokens import FileTokenStore, KeyringTokenStore, default_token_store, keyring_place
from engine.resources.settings import SETTINGS_FILE, settings_path

APP_NAME = "learning-at-home"
LOCK_FILE = "node.lock"
CONTROL_FILE = "control.json"
IDENTITY_FILE = "identity.key"
TOKEN_FILE = "token.json"
TRAFFIC_FILE = "traffic.json"
LOG_FILE = "node.log"

__all__ = ["NodeHome", "runtime_dir", "user_data_dir"]


def runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The default home's lock and control file: the session's runtime folder on Linux (gone at logout,
    as a node is), else the user config folder."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR") if sys.platform.startswith("linux") else None
    if runtime:
        return Path(runtime) / APP_NAME
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def user_data_dir() -> Path:
    """The default home's identity, token file, checkpoints and traffic counter (the tray app's too)."""
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


@dataclass(frozen=True)
class NodeHome:
    data: Path  # identity, checkpoints, traffic counter
    settings: Path
    runtime: Path  # the instance lock and the control connection file
    token_file: Path | None  # None: the OS keyring where usable, else data/token.json
    log_file: Path | None  # None: the console only
    explicit: bool  # given as --data-dir (everything inside it)

    @classmethod
    def default(cls) -> NodeHome:
        return cls(user_data_dir(), settings_path(), runtime_dir(), None, None, explicit=False)

    @classmethod
    def at(cls, folder: Path) -> NodeHome:
        root = Path(folder).expanduser().absolute()
        return cls(
            root, root / SETTINGS_FILE, root, root / TOKEN_FILE, root / "logs" / LOG_FILE, explicit=True
        )

    @classmethod
    def choose(
        cls, folder: Path | None, *, settings: Path | None = None, token_file: Path | None = None
    ) -> NodeHome:
        """``--data-dir`` (or the default home), with ``--settings`` / ``--token-file`` replacing one file."""
        home = cls.at(folder) if folder is not None else cls.default()
        if settings is not None:
            home = replace(home, settings=Path(settings).expanduser().absolute())
        if token_file is not None:
            home = replace(home, token_file=Path(token_file).expanduser().absolute())
        return home

    @property
    def lock(self) -> Path:
        return self.runtime / LOCK_FILE

    @property
    def control(self) -> Path:
        return self.runtime / CONTROL_FILE

    @property
    def identity(self) -> Path:
        return self.data / IDENTITY_FILE

    @property
    def traffic(self) -> Path:
        return self.data / TRAFFIC_FILE

    def prepare(self) -> None:
        """Create the home before anything is written in it; an explicit one only its owner may enter."""
        self.data.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.explicit and os.name == "posix":
            self.data.chmod(0o700)

    def token_store(self) -> KeyringTokenStore | FileTokenStore:
        if self.token_file is not None:
            return FileTokenStore(self.token_file)
        return default_token_store(self.data, file_name=TOKEN_FILE)

    def adopt_keyring_token(self, key: str) -> bool:
        """A ``--data-dir`` home made before the home held its token: the token went to the keyring then
        (one entry per coordinator for the whole user). Copy that entry into the home's file once, so
        the node keeps its account; from then on the file is the node's and the keyring is not read."""
        own_file = self.data / TOKEN_FILE
        if (
            not self.explicit
            or self.token_file != own_file
            or own_file.exists()
            or not self.identity.exists()
        ):
            return False
        try:
            store = default_token_store(self.data, file_name=TOKEN_FILE)
            value = store.get(key) if isinstance(store, KeyringTokenStore) else None
        except Exception:  # a locked or broken keyring: nothing to adopt
            return False
        if value is None:
            return False
        FileTokenStore(own_file).set(key, value)
        return True

    def describe(self) -> str:
        """One line for the node's startup log: where this node's files are."""
        store = self.token_store()
        token = keyring_place() if isinstance(store, KeyringTokenStore) else str(store.path)
        where = f"home {self.data}" if self.explicit else f"data {self.data}"
        return f"{where}; settings {self.settings}; token {token}; lock {self.lock}"
