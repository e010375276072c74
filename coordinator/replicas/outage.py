"""The database is away: a clear 503, never a 500 or a hang, and ``/healthz`` that says so.

When PostgreSQL restarts (or the network to it breaks) every request that needs it fails; what the
client gets is ``503 {"error": "database_unavailable", ...}`` with ``Retry-After``, from one
middleware that recognises a lost or refused connection wherever the handler met it. Nothing is
half-written: each write is one transaction, rolled back by the server when its connection goes.
The pool pings a connection before lending it (``db.session``), so the first requests after the
server is back do not fail on connections that died with it.

``HEALTH_CHECKS`` holds the app's named checks (``name -> async () -> bool``): ``/healthz`` runs them
all, each within ``CHECK_TIMEOUT_S``, and answers 200 when all pass, else 503, with every result in
the body. The full coordinator registers ``database``; other parts (e.g. a signal relay's listener)
add theirs the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg  # type: ignore[import-untyped]
from aiohttp import web
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ..http.framework import error_response

CHECK_TIMEOUT_S = 3.0
RETRY_AFTER_S = 5
HealthCheck = Callable[[], Awaitable[bool]]
HEALTH_CHECKS = web.AppKey("health_checks", dict)  # dict[str, HealthCheck]

# SQLSTATE classes and codes that mean "no connection": 08 connection exception, 57P01-57P03 admin
# shutdown / crash / cannot connect now, 53300 too many connections.
_OUTAGE_STATES = ("08", "57P01", "57P02", "57P03", "53300")


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen) or len(seen) > 16:
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "orig", None)]
    return seen


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says the database cannot be reached (as opposed to a bug or bad data)."""
    for e in _chain(error):
        if isinstance(e, sa_exc.DBAPIError) and e.connection_invalidated:
            return True
        if isinstance(e, sa_exc.TimeoutError):  # no pooled connection came free
            return True
        if isinstance(e, (ConnectionError, TimeoutError, asyncpg.exceptions.ConnectionDoesNotExistError)):
            return True
        if isinstance(e, asyncpg.PostgresError):
            state = getattr(e, "sqlstate", "") or ""
            if state.startswith(_OUTAGE_STATES):
                return True
            if state == "55000" and "not currently accepting connections" in str(e):
                return True
    return False


@web.middleware
async def database_outage(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as e:
        if not is_outage(e):
            raise
        return error_response(
            503,
            "database_unavailable",
            "the coordinator's database is unreachable; retry shortly",
            {"Retry-After": str(RETRY_AFTER_S)},
        )


def database_check(engine: AsyncEngine) -> HealthCheck:
    async def check() -> bool:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return True

    return check


async def run_checks(checks: dict[str, HealthCheck]) -> dict[str, bool]:
    async def one(check: HealthCheck) -> bool:
        try:
            return bool(await asyncio.wait_for(check(), CHECK_TIMEOUT_S))
        except Exception:
            return False

    names = list(checks)
    results = await asyncio.gather(*(one(checks[n]) for n in names))
    return dict(zip(names, results, strict=True))
