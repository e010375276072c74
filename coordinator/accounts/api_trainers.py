"""JSON API for trainers (``lah train``): experiments' configs, trainer login, the admin's grant.

::

    GET  /api/experiments           trainer token                 -> 200 {"experiments": [summary...]}
    GET  /api/experiments/{name}    trainer token                 -> 200 {"experiment": config}
    POST /api/trainers/login        {"name", "code"}              -> 200 {"account", "token", "expires_at"}
    POST /api/admin/trainers        admin token {"name", "ttl_s"?} -> 201 {"account", "code", "expires_at"}

An experiment's config is :class:`coordinator.config.ExperimentConfig` as JSON: the experts' type,
grid and hyperparameters, the target batch size of the collaboration and the dense model's shape
(``dense``); a summary leaves out the hyperparameters and the dense part. Experiments are for trainer
(or admin) accounts: 401 without a valid token (``token_required``, ``token_invalid``,
``token_expired``, ``token_revoked``), 403 ``not_a_trainer`` for a volunteer's, 403
``account_disabled``, 404 ``unknown_experiment``. The login takes a single-use code from the operator's
grant (:mod:`coordinator.accounts.trainers`): 403 ``invite_invalid`` for a wrong, used or expired code or
name, 403 ``forbidden`` for an account that is not a trainer, 429 ``rate_limited`` past the per-address
budget registrations have (``register_per_ip_per_minute``). Errors are the shared JSON shape
(``coordinator.http``).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec
from aiohttp import web

from ..config import ExperimentConfig
from ..credit.ledger import TRAINER_ROLES
from ..http.framework import ApiError, Text, account_errors, authenticate, read_body
from ..services import SERVICES, Services
from .accounts import AccountView
from .trainers import grant_trainer, redeem_login_code


class LoginRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Text
    code: Annotated[str, msgspec.Meta(max_length=128)]


class GrantRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Text
    ttl_s: float | None = None


def _services(request: web.Request) -> Services:
    return request.app[SERVICES]


async def _trainer(request: web.Request) -> AccountView:
    """A valid token (401) of an enabled (403) trainer or admin account (403 ``not_a_trainer``)."""
    claims, _ = await authenticate(request)
    account = await _services(request).accounts.require_enabled(claims.sub)
    if account.role not in TRAINER_ROLES:
        raise ApiError(
            403, "not_a_trainer", "experiments are for trainer accounts (an admin grants the role)"
        )
    return account


def summary(experiment: ExperimentConfig) -> dict[str, Any]:
    return {
        "name": experiment.name,
        "kind": experiment.kind,
        "expert_type": experiment.expert_type,
        "grid": list(experiment.grid),
        "grids": [g.name for g in experiment.grids()],
        "target_batch_size": experiment.target_batch_size,
    }


@account_errors
async def list_experiments(request: web.Request) -> web.StreamResponse:
    await _trainer(request)
    experiments = _services(request).config.experiments
    return web.json_response({"experiments": [summary(e) for e in experiments]})


@account_errors
async def get_experiment(request: web.Request) -> web.StreamResponse:
    await _trainer(request)
    name = request.match_info["name"]
    for experiment in _services(request).config.experiments:
        if experiment.name == name:
            return web.json_response({"experiment": msgspec.to_builtins(experiment)})
    raise ApiError(404, "unknown_experiment", f"this coordinator runs no experiment called {name[:64]!r}")


@account_errors
async def login(request: web.Request) -> web.StreamResponse:
    services = _services(request)
    key = services.client_address(request)
    wait = await services.register_limiter.take(key)  # unauthenticated, like registering: the same budget
    if wait > 0:
        retry = max(1, math.ceil(wait))
        raise ApiError(429, "rate_limited", "too many logins from this address", {"Retry-After": str(retry)})
    body = await read_body(request, LoginRequest)
    account = await redeem_login_code(services.accounts, body.name, body.code)
    token = services.tokens.issue(account.id, account.role)  # "trainer" (or "admin")
    return web.json_response(
        {"account": account.to_json(), "token": token, "expires_at": services.tokens.decode(token).exp}
    )


@account_errors
async def grant(request: web.Request) -> web.StreamResponse:
    services = _services(request)
    claims, _ = await authenticate(request)
    body = await read_body(request, GrantRequest)
    account, code, expires_at = await grant_trainer(
        services.accounts, body.name, by=claims.sub, ttl_s=body.ttl_s
    )
    return web.json_response(
        {"account": account.to_json(), "code": code, "expires_at": expires_at}, status=201
    )


def setup_routes(app: web.Application) -> None:
    """Add the trainers' API to ``app``; ``app[SERVICES]`` must be set before the app starts."""
    app.router.add_get("/api/experiments", list_experiments)
    app.router.add_get("/api/experiments/{name}", get_experiment)
    app.router.add_post("/api/trainers/login", login)
    app.router.add_post("/api/admin/trainers", grant)
