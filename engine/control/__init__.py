"""Local control of a running node: only the same user on the same machine may use it.

Layers, bottom up (imports ``engine.node``, ``engine.resources``, ``engine.account`` (the coordinator's
errors a starting node may meet), and of ``engine.p2p`` the node's identity, link settings and
statistics and the compiled layer's state; never Qt, ``app/``, ``coordinator/``)::

    protocol      JSON-lines framing, the connection file (host, port, secret, pid; mode 0600), errors
    server        ControlServer: localhost TCP; first line must carry the secret; commands below
    headless      a node nobody sits at: limit flags for ``lah node``, hint_for (why it waits, what
                  changes that), NodeLog (the console and the home's log file)
    node_control  NodeControl: status / pause / resume / snooze / set_limits / reload on a Volunteer
    client        ControlClient: for the tray app and ``lah status|pause|resume|snooze``
    credit        describe_credit: the account's credit as a reading with its time (CLI and tray)
    commands      ``lah node`` (a NodeHome, its settings followed by a SettingsWatcher) and the
                  commands that reach a running node, by its home

Commands: ``status`` (``follow: true`` streams updates), ``pause``, ``resume``, ``snooze {seconds}``,
``set_limits {limits: {...}}`` (validated by ``engine.resources.validated``, saved, applied),
``feed_idle {seconds, source}`` (the user's idle time as the tray app sees it; preferred while fresh),
``shutdown`` (a clean stop, as SIGTERM; what the tray app's Quit uses on every OS), ``refresh_credit``
(read the account's credit from the coordinator now; replies at once, the value follows in the status).
``status`` adds the ``limits`` (in force: the file's with the command line's ``overrides`` on top),
``idle_source``, ``hint`` (why a waiting node waits and which setting or flag changes that) and
``traffic`` (today, this month, the cap) to the node's own keys.

Exceptions::

    ControlError            ``code`` + message, as sent back in error replies
    ├── Unauthorized        wrong or missing secret
    └── NodeNotRunning      no connection file, or nothing answers on its port

May import: engine.account, engine.files, engine.node, engine.p2p, engine.resources
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .client import ControlClient
from .protocol import (
    ConnectionInfo,
    ControlError,
    NodeNotRunning,
    Unauthorized,
    data_dir,
    default_connection_path,
    default_dir,
    file_mode,
)
from .server import Controller, ControlServer

if TYPE_CHECKING:
    from .node_control import NodeControl


def __getattr__(name: str) -> Any:
    """``NodeControl`` loads the node (and torch) on first use: the tray app's client never needs it."""
    if name == "NodeControl":
        return import_module(".node_control", __name__).NodeControl
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ConnectionInfo",
    "ControlClient",
    "ControlError",
    "ControlServer",
    "Controller",
    "NodeControl",
    "NodeNotRunning",
    "Unauthorized",
    "data_dir",
    "default_connection_path",
    "default_dir",
    "file_mode",
]
