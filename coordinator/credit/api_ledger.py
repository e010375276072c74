"""JSON API for credit: receipts in, spot-check reports in, leaderboards and histories out.

::

    POST /api/receipts                {"receipts": [SignedReceipt, ...]}  (<= 1000, body <= 1 MiB)
                                      -> 200 {"accepted", "duplicates", "withheld", "credit",
                                              "rejected": [{"receipt_id", "reason"}]}
    POST /api/spot-checks             SpotCheckReport -> 201 {"flag_id", "withheld_receipts",
                                                              "reversed_credit", "corroborated"}
    GET  /api/leaderboard?kind=users|teams|hosts&sort=total|recent&page=N&per_page=M
                                      -> 200 {"kind", "sort", "page", "per_page", "has_more", "entries"}
                                         (pages are cached for a few seconds)
    GET  /api/contributors/{account_id}?days=N
                                      -> 200 {"account", "hosts", "history": [{"day", "date", "credit"}]}
    GET  /api/stats                   -> 200 {"hosts", "requests_served", "credit_total", ...}

Receipts and reports carry their own signatures (a trainer's identity key), and posting them also
takes the trainer account's bearer token: checked first, so that nobody without a trainer account
makes the coordinator verify signatures, and each account's receipts pass a token bucket (a batch
costs its size, at least one). A receipt signed by a key that is not bound to the posting account is
rejected (``not_your_key``) before its signature is checked; one for an expert outside its
experiment's grid is ``unknown_expert``, one worth more than ``max_receipt_credit`` ``over_ceiling``;
the ledger's rules (:mod:`.rules`) add ``host_disabled``, ``host_is_trainer``, ``not_assigned``,
``over_host_cap`` and ``over_pair_cap``. A spot-check report withholds the reporter's own grants unless
two trainer accounts agree (:mod:`.spot_checks`); a report seen before is 409 ``replayed``, one in the
future or before the host was bound 422 (``future_period``, ``before_host``), a reporter's fourth on one
host in a day 429 ``too_many_reports``.
Bytes fields are base64. Errors are ``{"error": code, "message": text}``: 400 (not JSON, bad query),
401 (no or bad token), 413 (body too large), 422 (JSON that does not fit the schema, bad period), 403
(bad signature, not a trainer, account disabled), 404 (unknown host or account), 429 (over the
account's rate, with Retry-After).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..accounts.accounts import AccountView
from ..config import CoordinatorConfig
from ..http.framework import ApiError, account_errors, json_errors, read_json, require_trainer
from ..services import SERVICES
from .leaderboard import KINDS, SORTS, LeaderboardError, contributor, leaderboard, swarm_stats
from .ledger import ingest
from .receipts import MAX_BODY_BYTES, MAX_REPORT_BYTES, ReceiptBatch, SpotCheckReport, Verifier
from .rules import CreditCaps
from .spot_checks import SpotCheckRejected, report_spot_check


@dataclass
class LedgerDeps:
    """What the handlers need; by default taken from ``app[SERVICES]``."""

    sessions: async_sessionmaker[AsyncSession]
    expert_costs: Mapping[str, float] | None = None  # experiment -> credit per sample; None: all 1.0
    verifier: Verifier | None = None  # signature checks; Verifier(workers=N) for a process pool
    grids: Mapping[str, Sequence[int]] | None = None  # experiment -> grid; None: any uid
    max_credit: float | None = None  # per receipt
    caps: CreditCaps | None = None  # per host and per (trainer, host) per hour; None: CreditCaps()

    @classmethod
    def of(
        cls, config: CoordinatorConfig, sessions: async_sessionmaker[AsyncSession], verifier: Verifier | None
    ) -> LedgerDeps:
        """The configured experiments' costs and grids, and the credit ceiling."""
        grids = {e.name: tuple(e.grid) for e in config.grids} if config.experiments else None
        caps = CreditCaps(dict(config.host_credit_per_hour), config.pair_credit_share)
        return cls(sessions, expert_costs_of(config), verifier, grids, config.max_receipt_credit, caps)


class PageCache:
    """Leaderboard pages for a few seconds: they change slowly, and are what every visitor loads."""

    def __init__(self, ttl_s: float = 5.0, max_entries: int = 2048) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._pages: dict[tuple[str, str, int, int], tuple[float, dict[str, Any]]] = {}

    def get(self, key: tuple[str, str, int, int]) -> dict[str, Any] | None:
        hit = self._pages.get(key)
        if hit is None or time.monotonic() - hit[0] > self.ttl_s:
            return None
        return hit[1]

    def put(self, key: tuple[str, str, int, int], page: dict[str, Any]) -> None:
        if len(self._pages) >= self.max_entries:
            self._pages.clear()
        self._pages[key] = (time.monotonic(), page)


LEDGER = web.AppKey("ledger", LedgerDeps)
PAGES = web.AppKey("ledger_pages", PageCache)
_VERIFIER = Verifier()  # in-process, with a cache of parsed trainer keys shared by all requests


def expert_costs_of(config: CoordinatorConfig) -> Mapping[str, float] | None:
    """Configured experiments' costs; None when none are configured (every expert costs 1.0)."""
    if not config.experiments:
        return None
    return {e.name: e.expert_cost for e in config.grids}


def _deps(request: web.Request) -> LedgerDeps:
    deps = request.app.get(LEDGER)
    if deps is not None:
        return deps
    services = request.app[SERVICES]
    return LedgerDeps.of(services.config, services.sessions, _VERIFIER)


async def _charge(request: web.Request, account: AccountView, cost: int) -> None:
    limiter = request.app[SERVICES].receipt_limiter
    wait = await limiter.take(str(account.id), float(max(1, cost)))
    if wait > 0:
        retry = max(1, math.ceil(wait))
        raise ApiError(
            429, "rate_limited", "too many receipts from this account", {"Retry-After": str(retry)}
        )


T = TypeVar("T")


async def _read_body(request: web.Request, kind: type[T], limit: int) -> T:
    return await read_json(request, kind, limit, invalid_status=422)


def _int_param(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, "bad_query", f"{name} must be an integer") from None


@account_errors
async def post_receipts(request: web.Request) -> web.StreamResponse:
    account = await require_trainer(request)
    deps = _deps(request)
    batch = await _read_body(request, ReceiptBatch, MAX_BODY_BYTES)
    await _charge(request, account, len(batch.receipts))
    result = await ingest(
        deps.sessions,
        batch,
        expert_costs=deps.expert_costs,
        verifier=deps.verifier,
        grids=deps.grids,
        max_credit=deps.max_credit,
        account_id=account.id,
        caps=deps.caps,
    )
    return web.json_response(result.to_json())


_SPOT_STATUS = {
    "bad_signature": 403,
    "not_a_trainer": 403,
    "unknown_host": 404,
    "bad_period": 422,
    "future_period": 422,
    "before_host": 422,
    "replayed": 409,
    "too_many_reports": 429,
}


@account_errors
async def post_spot_check(request: web.Request) -> web.StreamResponse:
    account = await require_trainer(request)
    deps = _deps(request)
    report = await _read_body(request, SpotCheckReport, MAX_REPORT_BYTES)
    await _charge(request, account, 1)
    if await request.app[SERVICES].accounts.host_owner(report.reporter_peer_id) != account.id:
        raise ApiError(403, "not_your_key", "the report is signed by a key not bound to this account")
    try:
        result = await report_spot_check(deps.sessions, report)
    except SpotCheckRejected as e:
        raise ApiError(_SPOT_STATUS.get(e.code, 422), e.code, str(e)) from e
    return web.json_response(
        {
            "flag_id": result.flag_id,
            "withheld_receipts": result.withheld_receipts,
            "reversed_credit": result.reversed_credit,
            "corroborated": result.corroborated,
        },
        status=201,
    )


@json_errors
async def get_leaderboard(request: web.Request) -> web.StreamResponse:
    deps = _deps(request)
    kind = request.query.get("kind", "users")
    sort = request.query.get("sort", "total")
    if kind not in KINDS:
        raise ApiError(400, "bad_kind", f"kind must be one of {', '.join(KINDS)}")
    if sort not in SORTS:
        raise ApiError(400, "bad_sort", f"sort must be one of {', '.join(SORTS)}")
    page = _int_param(request, "page", 1)
    per_page = _int_param(request, "per_page", 50)
    cache = request.app.get(PAGES)
    key = (kind, sort, page, per_page)
    data = cache.get(key) if cache is not None else None
    if data is None:
        try:
            result = await leaderboard(deps.sessions, kind, sort, page=page, per_page=per_page)  # type: ignore[arg-type]
        except LeaderboardError as e:
            raise ApiError(400, e.code, str(e)) from e
        data = result.to_json()
        if cache is not None:
            cache.put(key, data)
    return web.json_response(data)


@json_errors
async def get_contributor(request: web.Request) -> web.StreamResponse:
    deps = _deps(request)
    try:
        account_id = int(request.match_info["account_id"])
    except ValueError:
        raise ApiError(400, "bad_account_id", "account ids are integers") from None
    if not 0 < account_id < 2**31:
        raise ApiError(404, "not_found", "no such account")
    info = await contributor(deps.sessions, account_id, days=_int_param(request, "days", 90))
    if info is None:
        raise ApiError(404, "not_found", "no such account")
    return web.json_response(info)


@json_errors
async def get_swarm(request: web.Request) -> web.StreamResponse:
    return web.json_response(await swarm_stats(_deps(request).sessions))


def setup_routes(app: web.Application, deps: LedgerDeps | None = None, page_cache_s: float = 5.0) -> None:
    """Add the ledger's routes. ``deps``: what to use instead of ``app[SERVICES]`` (tests, benchmarks);
    ``page_cache_s``: how long a leaderboard page is served from memory (0: not at all)."""
    if deps is not None:
        app[LEDGER] = deps
    if page_cache_s > 0:
        app[PAGES] = PageCache(page_cache_s)
    app.router.add_post("/api/receipts", post_receipts)
    app.router.add_post("/api/spot-checks", post_spot_check)
    app.router.add_get("/api/leaderboard", get_leaderboard)
    app.router.add_get("/api/contributors/{account_id}", get_contributor)
    app.router.add_get("/api/stats", get_swarm)
