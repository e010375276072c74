"""Rate limits that hold across every replica of the coordinator, and the one interface both kinds share.

A limit keyed by something global (registrations per client address, receipts per trainer account)
must count every replica's requests: with N replicas behind a proxy that spreads requests, N
in-memory buckets would let N times the limit through. On PostgreSQL such a bucket is one row of
``rate_buckets`` and a take is ONE statement (INSERT ... ON CONFLICT DO UPDATE ... RETURNING): the
refill is computed from the database's ``now()``, the row lock serialises concurrent takes, so the
answer is exact under any concurrency and no replica's clock matters (one that is a minute off
refills nothing early or late). One round trip per take; these limits guard requests that write the
database anyway.

SQLite is one process: :class:`LocalBuckets` wraps the in-memory
:class:`~coordinator.http.ratelimit.RateLimiter` (its clock a parameter, so tests drive it). Limits that
stay per replica on purpose: the signaling hub's offers per sender (``offer_gate.OfferGate``: a sender's
offers all go through the one socket it holds, on one replica) and concurrent WebSockets per address
(``ratelimit.ConnectionLimiter``: each replica bounds what one address can hold open on it, so the whole
group bounds it to N times the limit; the proxy's own per-address connection limit, e.g. nginx's
``limit_conn``, is the global one).
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import Float, bindparam, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..http.ratelimit import RateLimiter


class Buckets(Protocol):
    """Token buckets by key: ``take`` answers 0.0 when granted, else the seconds to wait."""

    async def take(self, key: str, cost: float = 1.0) -> float: ...

    async def prune(self) -> int: ...


class LocalBuckets:
    """This process's memory: right for one process (SQLite), and for limits that are per socket."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    async def take(self, key: str, cost: float = 1.0) -> float:
        if self.limiter.allow(key, cost):
            return 0.0
        return max(self.limiter.retry_after(key, cost), 1e-3)

    async def prune(self) -> int:
        return self.limiter.prune()


_FLOATS = [bindparam(name, type_=Float) for name in ("cost", "rate", "burst")]
# The refill, computed once per statement from the row being updated and the database's clock.
_REFILL = "LEAST(:burst, b.tokens + GREATEST(0.0, CAST(EXTRACT(EPOCH FROM now()) AS float8) - b.at) * :rate)"
_TAKE = text(
    f"""
    INSERT INTO rate_buckets AS b (scope, key, tokens, at, granted)
    VALUES (:scope, :key,
            CASE WHEN :cost <= :burst THEN :burst - :cost ELSE :burst END,
            CAST(EXTRACT(EPOCH FROM now()) AS float8), :cost <= :burst)
    ON CONFLICT (scope, key) DO UPDATE SET
        tokens = CASE WHEN {_REFILL} >= :cost THEN {_REFILL} - :cost ELSE {_REFILL} END,
        granted = {_REFILL} >= :cost,
        at = GREATEST(b.at, CAST(EXTRACT(EPOCH FROM now()) AS float8))
    RETURNING b.tokens, b.granted
    """
).bindparams(*_FLOATS)
_PRUNE = text(
    "DELETE FROM rate_buckets AS b WHERE b.scope = :scope AND "
    "b.tokens + GREATEST(0.0, CAST(EXTRACT(EPOCH FROM now()) AS float8) - b.at) * :rate >= :burst"
).bindparams(*_FLOATS[1:])


class DatabaseBuckets:
    """One ``scope`` of token buckets in PostgreSQL's ``rate_buckets``: at most ``burst`` at once per key,
    refilled at ``rate`` per second of the database's clock."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], scope: str, rate: float, burst: float
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a rate limiter needs rate > 0 and burst >= 1")
        if not 0 < len(scope) <= 16:
            raise ValueError("a bucket scope is 1 to 16 characters")
        self.sessions = sessions
        self.scope = scope
        self.rate = float(rate)
        self.burst = float(burst)

    @classmethod
    def per_minute(
        cls, sessions: async_sessionmaker[AsyncSession], scope: str, count: int
    ) -> DatabaseBuckets:
        return cls(sessions, scope, rate=max(count, 1) / 60.0, burst=max(count, 1))

    def _params(self, key: str, cost: float) -> dict[str, object]:
        return {
            "scope": self.scope,
            "key": key[:64],
            "cost": float(cost),
            "rate": self.rate,
            "burst": self.burst,
        }

    async def take(self, key: str, cost: float = 1.0) -> float:
        async with self.sessions() as s, s.begin():
            tokens, granted = (await s.execute(_TAKE, self._params(key, cost))).one()
        if granted:
            return 0.0
        return max((cost - float(tokens)) / self.rate, 1e-3)

    async def prune(self) -> int:
        """Forget buckets that are full again (as good as new); returns how many."""
        async with self.sessions() as s, s.begin():
            result = await s.execute(_PRUNE, {"scope": self.scope, "rate": self.rate, "burst": self.burst})
        return int(getattr(result, "rowcount", 0) or 0)
