"""JSON API of collaborative training: trainers' status reports in, the collaborations and trainers out.

::

    POST /api/collab/status     StatusReport (coordinator.swarm.collab_status; body <= 4 KiB)
                                -> 200 {"experiment", "peer_id", "claimed_added"}
    GET  /api/collab            -> 200 {"collaborations": [CollabView, ...]}  (the swarm page's panel)
    GET  /api/collab/trainers?page=N
                                -> 200 {"page", "per_page", "count", "trainers": [TrainerRow, ...]}

Posting takes the bearer token of an enabled trainer (or admin) account, as receipts do (401 without a
valid token, 403 for other roles), and the report's ``peer_id`` must be a key bound to that account
(403 ``not_your_key``). Each account's reports pass a token bucket (``REPORTS_PER_MINUTE``, 429 with
Retry-After beyond; with replicas it is a shared bucket in the database, and the expiry of old
reports is a job of the leading replica: ``coordinator.services``). Errors are
``{"error": code, "message": text}``: 400 (not JSON), 413 (too large),
422 (JSON outside the schema, non-finite numbers, inconsistent fields, a processed-samples counter gone
backwards, an experiment that is not collaborative), 404 (unknown experiment). A refused report stores
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator

from aiohttp import web

from ..credit.training import trainer_board
from ..http.framework import ApiError, account_errors, json_errors, read_json, require_trainer
from ..http.ratelimit import RateLimiter
from ..replicas.shared_limits import Buckets, DatabaseBuckets, LocalBuckets
from ..services import SERVICES
from .collab_status import (
    MAX_BODY_BYTES,
    CollabStatusError,
    StatusReport,
    check,
    collaborations,
    expire,
    record,
)

REPORTS_PER_MINUTE = 60  # per account: a few trainers reporting every 5 s each, with room to spare
PER_PAGE = 50
EXPIRY_PERIOD_S = 60.0
MAX_PAGE = 200

REPORT_LIMITER = web.AppKey("collab_report_limiter", Buckets)
log = logging.getLogger(__name__)


@account_errors
async def post_status(request: web.Request) -> web.StreamResponse:
    account = await require_trainer(request)
    report = await read_json(request, StatusReport, MAX_BODY_BYTES, invalid_status=422)
    limiter = request.app[REPORT_LIMITER]
    key = str(account.id)
    wait = await limiter.take(key)
    if wait > 0:
        retry = max(1, math.ceil(wait))
        raise ApiError(
            429, "rate_limited", "too many status reports from this account", {"Retry-After": str(retry)}
        )
    services = request.app[SERVICES]
    try:
        check(report, services.config.experiments)
    except CollabStatusError as e:
        raise ApiError(e.status, e.code, str(e)) from e
    if await services.accounts.host_owner(report.peer_id) != account.id:
        raise ApiError(403, "not_your_key", "this peer id is not bound to your account")
    try:
        added = await record(services.sessions, account.id, report, time.time())
    except CollabStatusError as e:
        raise ApiError(e.status, e.code, str(e)) from e
    return web.json_response(
        {"experiment": report.experiment, "peer_id": report.peer_id, "claimed_added": added}
    )


@json_errors
async def get_collaborations(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    views = await collaborations(services.sessions, services.config.experiments)
    out = []
    for v in views:
        data = dataclasses.asdict(v)
        data["progress"] = v.progress
        out.append(data)
    return web.json_response({"collaborations": out})


@json_errors
async def get_trainers(request: web.Request) -> web.StreamResponse:
    raw = request.query.get("page", "1")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise ApiError(400, "bad_page", f"page must be a whole number from 1 to {MAX_PAGE}")
    board = await trainer_board(request.app[SERVICES].sessions, int(raw), PER_PAGE)
    return web.json_response(
        {
            "page": board.page,
            "per_page": board.per_page,
            "count": board.count,
            "trainers": [dataclasses.asdict(r) for r in board.rows],
        }
    )


async def _expiry(app: web.Application) -> AsyncIterator[None]:
    """Old reports deleted every ``EXPIRY_PERIOD_S`` on the app's loop, whether trainers report or not."""

    async def run() -> None:
        while True:
            await asyncio.sleep(EXPIRY_PERIOD_S)
            try:
                await expire(app[SERVICES].sessions)
            except Exception:  # the database may be briefly away: the next period tries again
                log.exception("expiring old collaboration status reports failed")

    task = asyncio.create_task(run(), name="collab-status-expiry")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def setup_routes(app: web.Application, limiter: RateLimiter | None = None) -> None:
    """Add the routes and the expiry task; ``limiter``: the reports' token bucket per account (tests
    pass one with a clock)."""
    services = app.get(SERVICES)
    if limiter is not None:
        app[REPORT_LIMITER] = LocalBuckets(limiter)
    elif services is not None and services.replicated:
        app[REPORT_LIMITER] = DatabaseBuckets.per_minute(services.sessions, "collab", REPORTS_PER_MINUTE)
    else:
        app[REPORT_LIMITER] = LocalBuckets(RateLimiter.per_minute(REPORTS_PER_MINUTE))
    if services is not None and services.replicated:  # on the leading replica only
        sessions = services.sessions
        services.leader.add_job("collab expiry", EXPIRY_PERIOD_S, lambda: expire(sessions), EXPIRY_PERIOD_S)
    else:
        app.cleanup_ctx.append(_expiry)
    app.router.add_post("/api/collab/status", post_status)
    app.router.add_get("/api/collab", get_collaborations)
    app.router.add_get("/api/collab/trainers", get_trainers)
