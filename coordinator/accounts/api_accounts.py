"""JSON API for accounts, hosts and tokens.

::

    POST /api/accounts         {"name", "team"?, "invite"?}       -> 201 {"account", "token", "expires_at"}
    POST /api/hosts            {"public_key", "signature"} base64 -> 201 (200 if bound already) {"peer_id"}
    POST /api/tokens/refresh   (no body)                          -> 200 {"token", "expires_at"}
    POST /api/tokens/revoke    {"jti"?} (default: this token)     -> 200 {"revoked": jti}
    POST /api/admin/role       {"name", "role"}                   -> 200 {"account"}
    POST /api/admin/allowlist  {"add"?: [...], "remove"?: [...]}  -> 200 {"added", "removed"}
    POST /api/admin/invites    {"name", "ttl_s"?}                 -> 201 {"name", "code", "expires_at"}
    POST /api/admin/disable    {"name", "disabled"}               -> 200 {"account", "disabled"}
    GET  /api/me                                                  -> 200 {"account", "hosts", "token"}

Authenticated calls take ``Authorization: Bearer <token>``. Bodies are JSON, at most
``http.framework.MAX_BODY_BYTES``, decoded into typed structs (unknown fields refused). Every failure is
``{"error": code, "message": text}`` with 400 (malformed), 401 (no, bad, expired or revoked token),
403 (``account_disabled`` on every authenticated call of a disabled account, at once), 404, 409
(name or host taken, or a name that looks like a taken one), 413 (body too large) or 429 (rate
limited, with Retry-After), and changes nothing. The signature for ``/api/hosts`` is the host key's
signature of ``accounts.bind_message(account id)``.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any

import msgspec
from aiohttp import web
from sqlalchemy import func, select

from ..credit.ledger import decay
from ..db.models import Account
from ..http.framework import ApiError, Text, account_errors, authenticate, read_body
from ..hub.signaling import HUB_KEY
from ..services import SERVICES, Services
from .tokens import is_jti

MAX_LIST = 1000


class RegisterRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Text
    team: Text | None = None
    invite: Annotated[str, msgspec.Meta(max_length=128)] | None = None


class InviteRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Text
    ttl_s: float | None = None


class DisableRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Text
    disabled: bool


class BindRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    public_key: Annotated[bytes, msgspec.Meta(max_length=64)]
    signature: Annotated[bytes, msgspec.Meta(max_length=128)]


class RevokeRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    jti: Text | None = None


class RoleRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Text
    role: Text


class AllowlistRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    add: Annotated[list[Text], msgspec.Meta(max_length=MAX_LIST)] = []
    remove: Annotated[list[Text], msgspec.Meta(max_length=MAX_LIST)] = []


class Empty(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


def _services(request: web.Request) -> Services:
    return request.app[SERVICES]


def _client_key(request: web.Request) -> str:
    return _services(request).client_address(request)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


@account_errors
async def register(request: web.Request) -> web.StreamResponse:
    services = _services(request)
    key = _client_key(request)
    wait = await services.register_limiter.take(key)
    if wait > 0:
        retry = max(1, math.ceil(wait))
        raise ApiError(
            429, "rate_limited", "too many registrations from this address", {"Retry-After": str(retry)}
        )
    body = await read_body(request, RegisterRequest)
    account = await services.accounts.register(body.name, body.team, body.invite)
    token = services.tokens.issue(account.id, account.role)
    claims = services.tokens.decode(token)
    return _json({"account": account.to_json(), "token": token, "expires_at": claims.exp}, status=201)


@account_errors
async def bind_host(request: web.Request) -> web.StreamResponse:
    claims, _ = await authenticate(request)
    body = await read_body(request, BindRequest)
    peer_id, created = await _services(request).accounts.bind_host(
        claims.sub, body.public_key, body.signature
    )
    return _json({"peer_id": peer_id}, status=201 if created else 200)


@account_errors
async def refresh(request: web.Request) -> web.StreamResponse:
    services = _services(request)
    claims, token = await authenticate(request)
    await read_body(request, Empty)
    account = await services.accounts.get(claims.sub)
    new = await services.tokens.refresh(token, role=account.role)
    return _json({"token": new, "expires_at": services.tokens.decode(new).exp})


@account_errors
async def revoke(request: web.Request) -> web.StreamResponse:
    services = _services(request)
    claims, _ = await authenticate(request)
    body = await read_body(request, RevokeRequest)
    jti = claims.jti if body.jti is None else body.jti
    if not is_jti(jti):
        raise ApiError(400, "invalid_request", "jti must be 32 lowercase hex characters")
    if jti == claims.jti:
        await services.tokens.revoke(jti, claims.exp)
    else:  # someone else's token: admins only (they learn jtis from logs or reports)
        await services.accounts.require_admin(claims.sub)
        await services.tokens.revoke(jti)
    return _json({"revoked": jti})


@account_errors
async def set_role(request: web.Request) -> web.StreamResponse:
    services = _services(request)
    claims, _ = await authenticate(request)
    body = await read_body(request, RoleRequest)
    account = await services.accounts.set_role(body.name, body.role, by=claims.sub)
    return _json({"account": account.to_json()})


@account_errors
async def allowlist(request: web.Request) -> web.StreamResponse:
    services = _services(request)
    claims, _ = await authenticate(request)
    body = await read_body(request, AllowlistRequest)
    added, removed = await services.accounts.update_allowlist(body.add, body.remove, by=claims.sub)
    return _json({"added": added, "removed": removed})


@account_errors
async def invite(request: web.Request) -> web.StreamResponse:
    services = _services(request)
    claims, _ = await authenticate(request)
    body = await read_body(request, InviteRequest)
    code, expires_at = await services.accounts.invite(body.name, by=claims.sub, ttl_s=body.ttl_s)
    return _json({"name": body.name, "code": code, "expires_at": expires_at}, status=201)


@account_errors
async def disable(request: web.Request) -> web.StreamResponse:
    """Disable or re-enable an account; its hosts leave signaling at once (the hub's sweep)."""
    services = _services(request)
    claims, _ = await authenticate(request)
    body = await read_body(request, DisableRequest)
    account = await services.accounts.set_disabled(body.name, body.disabled, by=claims.sub)
    hub = request.app.get(HUB_KEY)
    if hub is not None and body.disabled:
        await hub.sweep_everywhere()
    return _json({"account": account.to_json(), "disabled": account.disabled})


@account_errors
async def me(request: web.Request) -> web.StreamResponse:
    services = _services(request)
    claims, _ = await authenticate(request)
    account = await services.accounts.get(claims.sub)
    hosts = await services.accounts.hosts_of(claims.sub)
    async with services.sessions() as session:
        row = (
            await session.execute(
                select(Account.credit_total, Account.credit_recent, Account.credit_recent_at).where(
                    Account.id == claims.sub
                )
            )
        ).one()
        # The rank the tray shows: one indexed count (ix_accounts_credit_total) of those ahead.
        ahead = await session.scalar(
            select(func.count())
            .select_from(Account)
            .where(Account.credit_total > row[0], Account.disabled.is_(False))
        )
    return _json(
        {
            "account": account.to_json(),
            "credit": {
                "total": row[0],
                "recent": decay(row[1], row[2], time.time()),
                "rank": 1 + (ahead or 0),
            },
            "hosts": hosts,
            "token": {"jti": claims.jti, "role": claims.role, "expires_at": claims.exp},
        }
    )


def setup_routes(app: web.Application) -> None:
    """Add the account API to ``app``; ``app[SERVICES]`` must be set before the app starts."""
    app.router.add_post("/api/accounts", register)
    app.router.add_post("/api/hosts", bind_host)
    app.router.add_post("/api/tokens/refresh", refresh)
    app.router.add_post("/api/tokens/revoke", revoke)
    app.router.add_post("/api/admin/role", set_role)
    app.router.add_post("/api/admin/allowlist", allowlist)
    app.router.add_post("/api/admin/invites", invite)
    app.router.add_post("/api/admin/disable", disable)
    app.router.add_get("/api/me", me)
