"""Before the swarm: the coordinator's address, the trainer's login, the experiment, in plain words.

A researcher's script meets the same coordinator API ``lah train`` does (the token ``lah train login``
kept, ``GET /api/me``, ``GET /api/experiments/{name}``), and the same ways to go wrong. Each becomes
one sentence saying what to do: an address that is not http(s); one where nothing listens (the
connection was refused) versus one that does not answer at all (a name that does not resolve, a
timeout); something that answers but is not a coordinator; no login, or a login no longer valid, or an
account that is not a trainer (each naming the command that fixes it); an experiment the coordinator
does not run. The translations are pure functions of the errors, so they are tested without sockets.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from engine.account.coordinator_api import CoordinatorApi
from engine.account.errors import CoordinatorError, CoordinatorUnreachable
from engine.account.tokens import Credentials
from engine.account.trainer_tokens import TrainerCredentials, fresh

from .errors import CoordinatorNotFound, LoginRequired, SwarmError, UnknownExperiment

__all__ = ["check_url", "explain_refusal", "explain_unreachable", "login_hint", "prepare", "probe"]

_DNS_ERROR: tuple[type[BaseException], ...] = (socket.gaierror,) + (
    (aiohttp.ClientConnectorDNSError,) if hasattr(aiohttp, "ClientConnectorDNSError") else ()
)


def check_url(url: str) -> str:
    """``url`` without a trailing slash, or :class:`CoordinatorNotFound` if it cannot be one."""
    parts = urlsplit(url.strip()) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise CoordinatorNotFound(
            f"{url!r} is not a coordinator's address: give its http:// or https:// URL, "
            "e.g. http://127.0.0.1:8470"
        )
    try:
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as e:
        raise CoordinatorNotFound(f"{url!r} is not a coordinator's address: {e}") from e
    if parts.query or parts.fragment:
        raise CoordinatorNotFound(f"{url!r} is not a coordinator's address: leave out the ?query and #part")
    return url.strip().rstrip("/")


def login_hint(url: str) -> str:
    return (
        f"run `lah train login --coordinator {url} --name NAME --code=CODE` with the code from the "
        "project's operator (who makes it with `lah coordinator grant-trainer NAME`)"
    )


def _causes(e: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        c = todo.pop()
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        yield c
        todo += [c.__cause__, c.__context__, getattr(c, "os_error", None)]


def explain_unreachable(url: str, e: CoordinatorUnreachable, timeout: float) -> CoordinatorNotFound:
    """No answer: refused (nothing listens there) or unreachable (no such host, no answer in time)."""
    causes = list(_causes(e))
    if any(
        isinstance(c, ConnectionRefusedError) or (isinstance(c, OSError) and c.errno == errno.ECONNREFUSED)
        for c in causes
    ):
        return CoordinatorNotFound(
            f"the connection to {url} was refused: nothing listens there. Is the coordinator running, "
            "and is this its address and port?"
        )
    if any(isinstance(c, _DNS_ERROR) for c in causes):
        host = urlsplit(url).hostname
        return CoordinatorNotFound(
            f"{url} is unreachable: the host name {host!r} does not resolve (check it)"
        )
    if any(isinstance(c, TimeoutError) for c in causes):
        return CoordinatorNotFound(
            f"{url} is unreachable: no answer within {timeout:g} s (a wrong address, a firewall, or the "
            "coordinator is down)"
        )
    return CoordinatorNotFound(f"{url} is unreachable: {e}")


def explain_refusal(url: str, experiment: str, e: CoordinatorError) -> SwarmError:
    """An answer with an error: what it means for a researcher's script, and what to do."""
    if e.code in ("http_error", "bad_reply"):  # no JSON error of ours: another server answered
        return CoordinatorNotFound(
            f"{url} answered, but not as a Learning@home coordinator ({e.status} {e.message}): "
            "check the address (the coordinator's site root, without a path)"
        )
    if e.status == 401:
        return LoginRequired(f"the trainer login for {url} is no longer valid ({e.code}): {login_hint(url)}")
    if e.code == "not_a_trainer":
        return LoginRequired(
            "this account is not a trainer: ask the project's operator to run "
            "`lah coordinator grant-trainer NAME`, then log in with the code it prints"
        )
    if e.code == "unknown_experiment":
        return UnknownExperiment(f"the coordinator at {url} runs no experiment called {experiment!r}")
    return SwarmError(f"the coordinator at {url} refused ({e.status} {e.code}): {e.message}")


async def probe(api: CoordinatorApi) -> None:
    """Whether a coordinator answers at ``api.url`` (without a token: its 401 says it is one)."""
    try:
        data = await api.get("/api/experiments")
    except CoordinatorError as e:
        if e.status == 401 and e.code not in ("http_error", "bad_reply"):
            return
        raise
    if not (isinstance(data, dict) and "experiments" in data):
        raise CoordinatorError(200, "bad_reply", "no list of experiments at /api/experiments")


async def prepare(
    api: CoordinatorApi, store: TrainerCredentials, stored: Credentials, experiment: str
) -> tuple[Credentials, str, dict[str, Any]]:
    """Fresh credentials carrying the account's role, the account's name and the experiment's config
    (``lah train``'s order: a role granted since the token was issued needs a refreshed token)."""
    credentials = await fresh(api, store, stored)
    me = await api.get("/api/me", credentials.token)
    try:
        name, token_role, role = str(me["account"]["name"]), me["token"]["role"], me["account"]["role"]
    except (KeyError, TypeError) as e:
        raise CoordinatorError(200, "bad_reply", f"unexpected /api/me reply: {e}") from e
    if token_role != role:
        credentials = await api.refresh(credentials)
        store.save(api.url, credentials)
    return credentials, name, await api.experiment(credentials.token, experiment)
