"""The volunteer node: joins the coordinator, hosts assigned experts, and yields the machine on demand.

Layers, bottom up (each imports only those below it; plus ``engine.p2p``, ``engine.dht``, ``engine.moe``,
``engine.resources``, ``engine.wire`` (the bytes a host binding signs, the gate's messages) and
``engine.files``; never Qt, ``app/`` or ``coordinator/``)::

    errors           the exception tree below
    config           VolunteerConfig: a node's timeouts and periods, its links' and governor's options
    tokens           TokenStore protocol: KeyringTokenStore (OS keyring), FileTokenStore (0600), Memory
    coordinator_api  the coordinator's HTTP API, the engine's one client of it (accounts, host binding,
                     token refresh, assignment with its proofs, energy; the trainer's receipts,
                     spot checks and evaluations for the experiment's page too)
    trainer_tokens   TrainerCredentials: a trainer's token (``lah train login``), which ``lah train``
                     and ``engine.swarm`` read; the trainer's default data dir
    memory           the memory budget offered to the coordinator; process RSS
    gate             WorkGate: one switch in front of moe.forward/backward ("unavailable" when closed)
    hosting          Hosting: the ExpertServer of the current assignment; release/restore memory
    lock             InstanceLock: one node per home (lock file with the PID, stale-lock detection)
    home             NodeHome: where one node keeps its lock, settings, identity, token and log
                     (today's per-user folders, or everything in ``--data-dir``)
    participation    assigned / reachable / chosen: why a node got no work, in plain words
    status           the status dict (keys documented there), from what it reads of a node
    volunteer        Volunteer: start/stop, upkeep (re-assign, re-declare, re-bootstrap), WorkHooks
    join             join_local(): fresh identity + account + start, for local swarms and demos

Exceptions::

    NodeError
    ├── CoordinatorError        the coordinator answered with an error (``status``, ``code``)
    ├── CoordinatorUnreachable  no answer from the coordinator (after the start retries, too)
    └── AlreadyRunning          another node of this home holds the instance lock (``pid``)

May import: engine.dht, engine.files, engine.moe, engine.p2p, engine.resources, engine.wire
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Light modules load at once; those that load torch, aiortc, the DHT or aiohttp load on first use, so
# the tray app can use the token stores in a process that never imports torch (nor aiohttp, ~26 MiB,
# after its first run).
from .errors import AlreadyRunning, CoordinatorError, CoordinatorUnreachable, NodeError
from .home import NodeHome
from .lock import InstanceLock
from .tokens import Credentials, FileTokenStore, KeyringTokenStore, MemoryTokenStore, TokenStore

_LAZY = {
    "AssignedExpert": "coordinator_api",
    "Assignment": "coordinator_api",
    "CoordinatorApi": "coordinator_api",
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
    from .coordinator_api import AssignedExpert, Assignment, CoordinatorApi
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
    "AssignedExpert",
    "Assignment",
    "CoordinatorApi",
    "CoordinatorError",
    "CoordinatorUnreachable",
    "Credentials",
    "FileTokenStore",
    "Hosting",
    "InstanceLock",
    "KeyringTokenStore",
    "MemoryTokenStore",
    "NodeError",
    "NodeHome",
    "TokenStore",
    "Volunteer",
    "VolunteerConfig",
    "WorkGate",
    "build_status",
    "join_local",
    "memory_budget",
    "process_rss",
]
