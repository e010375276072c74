"""What every JSON endpoint shares: the error shape, the handler wrapper, size-limited body reading, and
who is asking (bearer tokens, trainer accounts).

Every error is ``{"error": code, "message": text}`` with a 4xx status; a handler raises
:class:`ApiError` (or an exception its module translates into one) and never builds error responses.
:func:`account_errors` is :func:`json_errors` that also answers token errors (401) and account errors
(400, 403, 404, 409); :func:`authenticate` checks a bearer token of an enabled account,
:func:`require_trainer` one of a trainer (or admin) account, as every poster of receipts and reports
must be; :func:`read_body` reads the small bodies of the account, trainer and swarm APIs.

It sits above :mod:`coordinator.services` (authentication reads the token authority and the accounts
from ``app[SERVICES]``) and below every ``api_*`` module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import msgspec
from aiohttp import web

from ..accounts.accounts import (
    AccountError,
    AccountView,
    BadInvite,
    BadProof,
    Conflict,
    Forbidden,
    InvalidKey,
    InvalidName,
    InvalidRole,
    NotAllowlisted,
    NotFound,
)
from ..accounts.tokens import MAX_TOKEN_CHARS, Claims, TokenError
from ..credit.ledger import TRAINER_ROLES
from ..services import SERVICES

#: What :func:`read_body` accepts: the account, trainer and swarm APIs' bodies are small.
MAX_BODY_BYTES = 16 * 1024

Text = Annotated[str, msgspec.Meta(max_length=256)]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Translate = Callable[[Exception], "ApiError | None"]
T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status, headers=headers)


def json_errors(handler: Handler, translate: Translate | None = None) -> Handler:
    """Turn ApiError (and what ``translate`` maps to one) into the JSON error response."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e.status, e.code, e.message, e.headers)
        except Exception as e:
            api = translate(e) if translate is not None else None
            if api is None:
                raise
            return error_response(api.status, api.code, api.message, api.headers)

    wrapped.__name__ = handler.__name__
    return wrapped


async def read_json(
    request: web.Request,
    kind: type[T],
    limit: int,
    *,
    invalid_status: int = 400,
    empty_as: bytes | None = None,
) -> T:
    """The body as ``kind``, refusing more than ``limit`` bytes (413) even when chunked.

    ``empty_as``: what an empty body means (``b"{}"`` where every field is optional), else it is malformed.
    """
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, "too_large", f"request bodies are limited to {limit} bytes")
    body = bytearray()
    while True:
        chunk = await request.content.read(limit + 1 - len(body))
        if not chunk:
            break
        body += chunk
        if len(body) > limit:
            raise ApiError(413, "too_large", f"request bodies are limited to {limit} bytes")
    raw = bytes(body) or (empty_as if empty_as is not None else b"")
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        raise ApiError(invalid_status, "invalid_request", str(e)) from e
    except msgspec.DecodeError as e:
        raise ApiError(400, "malformed_json", f"the body is not JSON: {e}") from e


_STATUS: list[tuple[type[AccountError], int]] = [
    (InvalidName, 400),
    (InvalidRole, 400),
    (InvalidKey, 400),
    (BadProof, 403),
    (Forbidden, 403),
    (NotAllowlisted, 403),
    (BadInvite, 403),
    (NotFound, 404),
    (Conflict, 409),
]


def _status_of(error: AccountError) -> int:
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    return 400


def _translate(error: Exception) -> ApiError | None:
    if isinstance(error, TokenError):
        return ApiError(401, error.code, str(error), {"WWW-Authenticate": 'Bearer error="invalid_token"'})
    if isinstance(error, AccountError):
        return ApiError(_status_of(error), error.code, str(error))
    return None


def account_errors(handler: Handler) -> Handler:
    """ApiError, token and account errors as JSON errors."""
    return json_errors(handler, _translate)


async def read_body(request: web.Request, kind: type[T]) -> T:
    """The request's JSON body as ``kind``; an empty body counts as ``{}``."""
    return await read_json(request, kind, MAX_BODY_BYTES, empty_as=b"{}")


def bearer_token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401, "token_required", "send Authorization: Bearer <token>", {"WWW-Authenticate": "Bearer"}
        )
    token = token.strip()
    if len(token) > MAX_TOKEN_CHARS:
        raise TokenError("token is malformed")
    return token


async def authenticate(request: web.Request) -> tuple[Claims, str]:
    """The token's claims, for an account that exists and is enabled (else 401 or 403)."""
    token = bearer_token(request)
    services = request.app[SERVICES]
    claims = await services.tokens.verify(token)
    await services.accounts.require_enabled(claims.sub)
    return claims, token


async def require_trainer(request: web.Request) -> AccountView:
    """The poster's account: a valid token (401) of an enabled trainer or admin account (403)."""
    claims, _ = await authenticate(request)
    account = await request.app[SERVICES].accounts.require_enabled(claims.sub)
    if account.role not in TRAINER_ROLES:
        raise ApiError(403, "not_a_trainer", "only trainer accounts post receipts and spot checks")
    return account
