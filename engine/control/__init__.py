"""Local control of a running node: only the same user on the same machine may use it.

Layers, bottom up (imports ``engine.node`` and ``engine.resources``; never Qt, ``app/``, ``coordinator/``)::

    protocol      JSON-lines framing, the connection file (host, port, secret, pid; mode 0600), errors
    server        ControlServer: localhost TCP; first line must carry the secret; commands below
    node_control  NodeControl: status / pause / resume / snooze / set_limits on a Volunteer (+ Governor)
    client        ControlClient: for the tray app and ``lah status|pause|resume|snooze``

Commands: ``status`` (``follow: true`` streams updates), ``pause``, ``resume``, ``snooze {seconds}``,
``set_limits {limits: {...}}`` (validated by ``engine.resources.validated``, saved, applied),
``feed_idle {seconds, source}`` (the user's idle time as the tray app sees it; preferred while fresh),
``shutdown`` (a clean stop, as SIGTERM; what the tray app's Quit uses on every OS). ``status`` adds the
``limits``, ``idle_source`` and ``traffic`` (today, this month, the cap) to the node's own keys.

Exceptions::

    ControlError            ``code`` + message, as sent back in error replies
    ├── Unauthorized        wrong or missing secret
    └── NodeNotRunning      no connection file, or nothing answers on its port
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
