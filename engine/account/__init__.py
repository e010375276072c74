"""The account layer: a volunteer's or a trainer's token, where it is kept, and the engine's one client
of the coordinator's HTTP API.

The volunteer's node (:mod:`engine.node`), the trainer (:mod:`engine.trainer`, :mod:`engine.swarm`), the
tray app's first run (``app.core.registration``) and ``lah`` all sign in, keep tokens and call the
coordinator through this package, so none of them reaches into another's for it.

Layers, bottom up (each imports only those below it; plus ``engine.files`` (the 0600 token file),
``engine.wire`` (the bytes a host binding signs), and of ``engine.p2p`` and ``engine.moe`` an identity, the
signaling URL and an expert's spec; never Qt, ``app/`` or ``coordinator/``)::

    errors           the exception tree below
    tokens           TokenStore protocol: KeyringTokenStore (OS keyring), FileTokenStore (0600), Memory;
                     Credentials (account, token, expiry), default_token_store, keyring_place (in words)
    coordinator_api  the coordinator's HTTP API, the engine's one client of it (accounts, host binding,
                     token refresh, assignment with its proofs, energy; the trainer's login, receipts,
                     spot checks and evaluations for the experiment's page too)
    trainer_tokens   TrainerCredentials: a trainer's token (``lah train login``), which ``lah train``
                     and ``engine.swarm`` read; the trainer's default data dir
    outbox           Outbox: batches for the coordinator kept on disk, in order and bounded, until it
                     answers (a trainer's receipts and reports, a node's energy reports)

Exceptions (what every caller of the coordinator's API catches, the same classes for all)::

    AccountError
    ├── CoordinatorError        the coordinator answered with an error (``status``, ``code``)
    └── CoordinatorUnreachable  no answer from the coordinator

May import: engine.files, engine.moe, engine.p2p, engine.wire
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Light modules load at once; the HTTP client (aiohttp, ~26 MiB) loads on first use, so the tray app
# keeps its token stores in a process that never imports aiohttp after its first run, and nothing
# here ever imports torch or aiortc (``engine.moe`` and ``engine.p2p`` only inside functions).
from .errors import AccountError, CoordinatorError, CoordinatorUnreachable
from .tokens import (
    Credentials,
    FileTokenStore,
    KeyringTokenStore,
    MemoryTokenStore,
    TokenStore,
    default_token_store,
    keyring_place,
)
from .trainer_tokens import TrainerCredentials, default_trainer_dir

_LAZY = {
    "AssignedExpert": "coordinator_api",
    "Assignment": "coordinator_api",
    "CoordinatorApi": "coordinator_api",
}

if TYPE_CHECKING:
    from .coordinator_api import AssignedExpert, Assignment, CoordinatorApi


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AccountError",
    "AssignedExpert",
    "Assignment",
    "CoordinatorApi",
    "CoordinatorError",
    "CoordinatorUnreachable",
    "Credentials",
    "FileTokenStore",
    "KeyringTokenStore",
    "MemoryTokenStore",
    "TokenStore",
    "TrainerCredentials",
    "default_token_store",
    "default_trainer_dir",
    "keyring_place",
]
