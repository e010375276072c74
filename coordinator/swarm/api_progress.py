"""JSON API of experiments' training progress: a trainer's evaluation reports in.

::

    POST /api/experiments/{name}/progress   ProgressReport (coordinator.swarm.progress; body <= 16 KiB):
                                            {"step", "train_tokens", "val_loss", "tokens_per_s",
                                             "sample"?: generated text, <= 4 KiB of UTF-8}
                                            -> 200 {"experiment", "account_id", "kept"}

Posting takes the bearer token of an enabled trainer (or admin) account, as receipts and collaboration
status do (401 without a valid token, 403 ``not_a_trainer`` for other roles, 403 ``account_disabled``).
Each account's reports pass a token bucket (``REPORTS_PER_MINUTE``, 429 with Retry-After beyond; with
replicas a shared bucket in the database). Errors are ``{"error": code, "message": text}``: 400 (not
JSON), 404 ``unknown_experiment``, 413 ``too_large`` (the body) or ``sample_too_large``, 422
(outside the schema, non-finite numbers, ``sample_not_text``). A refused report stores nothing. What
is read back is the site's (``/experiments/{name}`` and ``/api/site/experiments/{name}``).
"""

from __future__ import annotations

import math
import time

from aiohttp import web

from ..http.framework import ApiError, account_errors, read_json, require_trainer
from ..http.ratelimit import RateLimiter
from ..replicas.shared_limits import Buckets, DatabaseBuckets, LocalBuckets
from ..services import SERVICES
from .progress import MAX_BODY_BYTES, ProgressError, ProgressReport, check, record

#: Per account: a trainer evaluates every few hundred steps; a demo's every few seconds at most.
REPORTS_PER_MINUTE = 30
PRUNE_PERIOD_S = 600.0

PROGRESS_LIMITER = web.AppKey("progress_limiter", Buckets)


@account_errors
async def post_progress(request: web.Request) -> web.StreamResponse:
    account = await require_trainer(request)
    report = await read_json(request, ProgressReport, MAX_BODY_BYTES, invalid_status=422)
    wait = await request.app[PROGRESS_LIMITER].take(str(account.id))
    if wait > 0:
        retry = max(1, math.ceil(wait))
        raise ApiError(
            429, "rate_limited", "too many progress reports from this account", {"Retry-After": str(retry)}
        )
    services = request.app[SERVICES]
    name = request.match_info["name"]
    try:
        sample = check(report, name, services.config.experiments)
        kept = await record(services.sessions, name, account.id, report, sample, time.time())
    except ProgressError as e:
        raise ApiError(e.status, e.code, str(e)) from e
    return web.json_response({"experiment": name, "account_id": account.id, "kept": kept})


def setup_routes(app: web.Application, limiter: RateLimiter | None = None) -> None:
    """Add the route; ``limiter``: the reports' token bucket per account (tests pass one with a clock)."""
    services = app.get(SERVICES)
    if limiter is not None:
        app[PROGRESS_LIMITER] = LocalBuckets(limiter)
    elif services is not None and services.replicated:
        shared = DatabaseBuckets.per_minute(services.sessions, "progress", REPORTS_PER_MINUTE)
        app[PROGRESS_LIMITER] = shared
        services.leader.add_job("progress buckets", PRUNE_PERIOD_S, shared.prune, PRUNE_PERIOD_S)
    else:
        app[PROGRESS_LIMITER] = LocalBuckets(RateLimiter.per_minute(REPORTS_PER_MINUTE))
    app.router.add_post("/api/experiments/{name}/progress", post_progress)
