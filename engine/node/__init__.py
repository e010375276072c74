"""The volunteer node: joins the coordinator, hosts assigned experts, and yields the machine on demand.

Layers, bottom up (each imports only those below it; plus ``engine.account`` (the token stores, the
coordinator's HTTP API and its errors), ``engine.p2p``, ``engine.dht``, ``engine.moe``,
``engine.resources`` and ``engine.wire`` (the gate's messages); never Qt, ``app/`` or ``coordinator/``)::

    errors           the exception tree below
    config           VolunteerConfig: a node's timeouts and periods, its links' and governor's options
    memory           the memory budget offered to the coordinator; process RSS
    gate             WorkGate: one switch in front of moe.forward/backward ("unavailable" when closed)
    hosting          Hosting: the ExpertServer of the current assignment; release/restore memory
    lock             InstanceLock: one node per home (lock file with the PID, stale-lock detection)
    home             NodeHome: where one node keeps its lock, settings, identity, token and log
                     (today's per-user folders, or everything in ``--data-dir``)
    participation    assigned / reachable / chosen: why a node got no work, in plain words
    reports          Reports: the node's energy reports, kept in an outbox on disk until delivered
    status           the status dict (keys documented there), from what it reads of a node
    volunteer        Volunteer: start/stop, upkeep (re-assign, re-declare, re-bootstrap), WorkHooks
    join             join_local(): fresh identity + account + start, for local swarms and demos

Exceptions (the coordinator's API fails with ``engine.account``'s ``CoordinatorError`` and
``CoordinatorUnreachable``, the same classes for every caller; the node catches them beside its own)::

    NodeError
    └── AlreadyRunning          another node of this home holds the instance lock (``pid``)

May import: engine.account, engine.dht, engine.moe, engine.p2p, engine.resources, engine.wire
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Light modules load at once; those that load torch, aiortc, the DHT or aiohttp load on first use, so
# the tray app can use a node's home (``engine.control``) in a process that never imports torch (nor
# aiohttp, ~26 MiB: ``engine.account`` loads its HTTP client lazily too).
from .errors import AlreadyRunning, NodeError
from .home import NodeHome
from .lock import InstanceLock

_LAZY = {
    "UNAVAILABLE": "gate",
    "WorkGate": "gate",
    "Hosting": "hosting",
    "join_local": "join",
    "memory_budget": "memory",
    "process_rss": "memory",
    "STATUS_KEYS": "status",
    "build_status": "status",
    "Volunteer": "volunteer",
    "VolunteerConfig": "config",
}

if TYPE_CHECKING:
    from .config import VolunteerConfig
    from .gate import UNAVAILABLE, WorkGate
    from .hosting import Hosting
    from .join import join_local
    from .memory import memory_budget, process_rss
    from .status import STATUS_KEYS, build_status
    from .volunteer import Volunteer


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "STATUS_KEYS",
    "UNAVAILABLE",
    "AlreadyRunning",
    "Hosting",
    "InstanceLock",
    "NodeError",
    "NodeHome",
    "Volunteer",
    "VolunteerConfig",
    "WorkGate",
    "build_status",
    "join_local",
    "memory_budget",
    "process_rss",
]
