"""What ``lah train`` and ``lah export`` share: a trainer's kept login, its account and experiment, and
its node joined to the swarm and left again.

:func:`kept_login` refuses a missing login with the command that makes one, after checking that a
coordinator answers at the URL at all (a mistyped ``--coordinator`` is said as such);
:func:`prepare` refreshes the token (so it carries a role granted since) and fetches the experiment;
:func:`start_node` builds and starts the :class:`~engine.trainer.TrainerNode` with an identity kept in the
data dir, storing each refreshed token before the old one is revoked; :func:`leave` stops it, naming
the hosts it refused, and releases the loop and the lock.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.account.errors import CoordinatorError, CoordinatorUnreachable
from engine.account.tokens import Credentials

from .train_credentials import TrainerCredentials, default_trainer_dir, fresh

if TYPE_CHECKING:
    from engine.trainer import TrainerNode

__all__ = [
    "TrainError",
    "default_data_dir",
    "explain",
    "kept_login",
    "leave",
    "no_coordinator",
    "pin_from_environment",
    "prepare",
    "start_node",
]

logger = logging.getLogger(__name__)


class TrainError(Exception):
    """A problem the researcher can fix (exit status 2): the message says how."""


def default_data_dir() -> Path:
    """The one a researcher's own script (``engine.swarm``) uses too: one login serves both."""
    return default_trainer_dir()


def kept_login(store: TrainerCredentials, url: str) -> Credentials:
    """The login kept for ``url``; :class:`TrainError` saying why there is none."""
    stored = store.load(url)
    if stored is not None:
        return stored
    from engine.p2p import eventloop

    not_there = eventloop.run(no_coordinator(url))
    if not_there is not None:  # a mistyped URL: say that, not that the login is missing
        raise TrainError(f"{not_there}: check --coordinator (no trainer login is kept for it either)")
    raise TrainError(
        f"no trainer login for {url}: run `lah train login --coordinator {url} --name NAME --code CODE` "
        "with the code from the project's operator (lah coordinator grant-trainer NAME)"
    )


def pin_from_environment() -> None:
    """``LAH_HOST_ADDRESSES`` (e.g. 127.0.0.1 for local swarms and tests): the only host candidates."""
    from engine.p2p.patches import pin_host_addresses

    pinned = os.environ.get("LAH_HOST_ADDRESSES")
    if pinned:
        pin_host_addresses([a.strip() for a in pinned.split(",") if a.strip()])


async def prepare(
    api: Any, store: TrainerCredentials, stored: Credentials, name: str
) -> tuple[Credentials, str, dict[str, Any]]:
    """Fresh credentials carrying the account's role, the account's name and the experiment's config."""
    try:
        credentials = await fresh(api, store, stored)
        me = await api.get("/api/me", credentials.token)
        if me["token"]["role"] != me["account"]["role"]:  # granted since: a token carrying the new role
            credentials = await api.refresh(credentials)
            store.save(api.url, credentials)
        spec = await api.experiment(credentials.token, name)
        return credentials, str(me["account"]["name"]), spec
    finally:
        await api.close()


PROBE_TIMEOUT_S = 10.0


async def no_coordinator(url: str) -> str | None:
    """None when a coordinator answers at ``url``; else why not, in a sentence."""
    from engine.account.coordinator_api import CoordinatorApi

    api = CoordinatorApi(url, timeout=PROBE_TIMEOUT_S)
    try:
        await api.get("/healthz")
    except CoordinatorUnreachable as e:
        return f"the coordinator at {url} is unreachable ({str(e).removeprefix(url + ' unreachable: ')})"
    except CoordinatorError as e:
        if e.status == 404:
            return f"{url} answers, but not as a Learning@home coordinator (no /healthz)"
    finally:
        await api.close()
    return None  # it answered (a 503 too: a coordinator whose database is away is still there)


def explain(e: CoordinatorError, url: str, name: str) -> str:
    if e.status == 401:
        return (
            f"the trainer login for {url} is no longer valid ({e.code}): ask the operator for a new code "
            "(lah coordinator grant-trainer NAME) and run `lah train login` again"
        )
    if e.code == "not_a_trainer":
        return "this account is not a trainer: ask the operator to run `lah coordinator grant-trainer NAME`"
    if e.code == "unknown_experiment":
        return f"the coordinator at {url} runs no experiment called {name!r}"
    return f"the coordinator refused: {e.code}: {e.message}"


def start_node(
    url: str,
    account: str,
    loop: Any,
    identity_file: Path,
    config: Any,
    credentials: Credentials,
    store: TrainerCredentials,
    outbox_dir: Path | None = None,
) -> TrainerNode:
    """The account's :class:`~engine.trainer.TrainerNode`, started, with ``identity_file``'s key;
    ``outbox_dir``: where its receipts and reports wait while the coordinator is away."""
    from engine.p2p import Identity
    from engine.trainer import TrainerNode

    def keep(refreshed: Credentials) -> None:  # the old token is revoked: store the new one first
        store.save(url, refreshed)

    node = TrainerNode(
        url,
        account,
        loop=loop,
        identity=Identity.load_or_create(identity_file),
        config=config,
        credentials=credentials,
        on_credentials=keep,
        outbox_dir=outbox_dir,
    )
    loop.run(node.start(), 60)
    assert node.peer is not None and node.finder is not None
    return node


def leave(node: Any, loop: Any, lock: Any, say: Callable[[str], None]) -> None:
    """Stop the node (naming the hosts it refused), then the loop, then the lock: whatever happened."""
    try:
        if node is not None:
            if (refused := node.refused_line()) is not None:
                say(refused)
            try:
                loop.run(node.stop(), 30)
            except Exception:
                logger.exception("leaving the swarm failed")
    finally:
        loop.close()
        lock.release()
