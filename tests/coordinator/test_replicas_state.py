"""Two full coordinators on one PostgreSQL schema: what one replica learns, the other honours.

Token revocations (announced by NOTIFY; the bound when the listener is cut), rate limits that count
every replica's requests (atomic buckets refilled on the database's clock), and a replica whose clock
is two minutes off. SQLite keeps its one-process behaviour (the rest of the suite).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import text

from coordinator.config import ConfigError, CoordinatorConfig
from coordinator.db.session import make_engine
from coordinator.replicas.shared_limits import DatabaseBuckets, LocalBuckets
from coordinator.server.app import RunningCoordinator
from coordinator.services import open_services

from .replicas_helpers import fresh_schema, start_replica, wait_for


async def _register(
    http: aiohttp.ClientSession, app: RunningCoordinator, name: str
) -> aiohttp.ClientResponse:
    return await http.post(f"{app.url}/api/accounts", json={"name": name})


async def _me(http: aiohttp.ClientSession, app: RunningCoordinator, token: str) -> int:
    async with http.get(f"{app.url}/api/me", headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status


async def test_a_revocation_on_one_replica_is_refused_by_the_other(tmp_path: Path) -> None:
    async with fresh_schema() as schema:
        a = await start_replica(tmp_path, schema)
        b = await start_replica(tmp_path, schema)
        try:
            await wait_for(lambda: a.services.listener.healthy and b.services.listener.healthy)  # type: ignore[union-attr]
            async with aiohttp.ClientSession() as http:
                r = await _register(http, a, "Ada")
                assert r.status == 201, await r.text()
                token = (await r.json())["token"]
                jti = a.services.tokens.decode(token).jti
                # B has checked the token: "not revoked", from its list in memory once loaded, else
                # from the database, cached (for 60 s while it listens).
                assert await _me(http, b, token) == 200
                assert jti in b.services.tokens._not_revoked or b.services.tokens.revocations_complete()
                r = await http.post(
                    f"{a.url}/api/tokens/revoke", headers={"Authorization": f"Bearer {token}"}, json={}
                )
                assert r.status == 200, await r.text()
                started = time.monotonic()
                await wait_for(lambda: jti in b.services.tokens._revoked, 10)  # told, not timed out
                assert await _me(http, b, token) == 401
                assert time.monotonic() - started < 10

                # Cut B's listener: until it is back, B trusts "not revoked" for 5 s only, and forgets
                # what it cached when it reconnects (notifications may have been missed meanwhile).
                r = await _register(http, a, "Grace")
                token2 = (await r.json())["token"]
                assert await _me(http, b, token2) == 200
                listener = b.services.listener
                assert listener is not None and listener.conn is not None
                pid = listener.conn.get_server_pid()
                async with a.services.engine.connect() as conn:
                    await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                    await conn.commit()
                r = await http.post(
                    f"{a.url}/api/tokens/revoke", headers={"Authorization": f"Bearer {token2}"}, json={}
                )
                assert r.status == 200
                bound = b.services.tokens.negative_cache_s + listener.ping_s + 5.0

                async def refused() -> bool:
                    return await _me(http, b, token2) == 401

                await wait_for(refused, timeout=bound + 10)
                await wait_for(lambda: listener.healthy and listener.conn is not None, 20)
                assert listener.conn.get_server_pid() != pid  # a new connection, listening again
        finally:
            await a.stop()
            await b.stop()


async def test_registration_limits_count_every_replica(tmp_path: Path) -> None:
    """Three registrations a minute per address, however they are spread and however concurrent."""
    async with fresh_schema() as schema:
        a = await start_replica(tmp_path, schema, register_per_ip_per_minute=3)
        b = await start_replica(
            tmp_path, schema, register_per_ip_per_minute=3, clock=lambda: time.time() + 120
        )
        try:
            assert isinstance(a.services.register_limiter, DatabaseBuckets)
            async with aiohttp.ClientSession() as http:
                replies = await asyncio.gather(
                    *(_register(http, (a, b)[i % 2], f"user{i}") for i in range(12))
                )
                statuses = sorted(r.status for r in replies)
                assert statuses == [201] * 3 + [429] * 9, statuses
                limited = [r for r in replies if r.status == 429]
                assert all(1 <= int(r.headers["Retry-After"]) <= 60 for r in limited)
                assert {(await r.json())["error"] for r in limited} == {"rate_limited"}
        finally:
            await a.stop()
            await b.stop()


async def test_shared_buckets_refill_on_the_database_clock(tmp_path: Path) -> None:
    """A bucket refills by the database's time, whatever the replica's clock says: a take right after
    the last one is refused, and after 1/rate seconds (database time) one more is granted."""
    async with fresh_schema() as schema:
        a = await start_replica(tmp_path, schema, clock=lambda: time.time() - 60)
        try:
            sessions = a.services.sessions
            fast = DatabaseBuckets(sessions, "test", rate=0.5, burst=2)
            assert [await fast.take("k") for _ in range(2)] == [0.0, 0.0]
            wait = await fast.take("k")
            assert 0 < wait <= 2.0
            assert await fast.take("k", cost=3) > 0  # more than the bucket holds: never granted now
            await asyncio.sleep(wait + 0.2)
            assert await fast.take("k") == 0.0
            other = DatabaseBuckets(sessions, "other", rate=2.0, burst=2)
            assert await other.take("k") == 0.0  # scopes are separate buckets
            await asyncio.sleep(4.5)
            assert await fast.prune() == 1  # full again: forgotten
            with pytest.raises(ValueError):
                DatabaseBuckets(sessions, "x" * 17, rate=1.0, burst=1)
        finally:
            await a.stop()


async def test_a_replica_with_a_clock_two_minutes_off_judges_tokens_by_the_database(tmp_path: Path) -> None:
    skew = 120.0
    async with fresh_schema() as schema:
        a = await start_replica(tmp_path, schema, clock=lambda: time.time() + skew)
        b = await start_replica(tmp_path, schema)
        try:
            assert a.services.db_clock is not None
            assert abs(a.services.db_clock.offset + skew) < 2.0
            assert abs(a.services.tokens.clock() - b.services.tokens.clock()) < 2.0
            async with aiohttp.ClientSession() as http:
                for issuer, checker in ((a, b), (b, a)):
                    r = await _register(http, issuer, f"from{issuer.port}")
                    assert r.status == 201, await r.text()
                    token = (await r.json())["token"]
                    assert await _me(http, checker, token) == 200
                    claims = checker.services.tokens.decode(token)
                    assert abs(claims.iat - time.time()) < 5  # issued on database time
            # The same replica without the correction issues tokens the others refuse as "not valid
            # yet": the test would catch a replica that used its own clock.
            from coordinator.accounts.tokens import TokenAuthority, TokenExpired, load_signing_key

            raw = TokenAuthority(
                load_signing_key(tmp_path / "token.key"),
                a.services.sessions,
                clock=lambda: time.time() + skew,
            )
            with pytest.raises(TokenExpired):
                b.services.tokens.decode(raw.issue(1, "volunteer"))
        finally:
            await a.stop()
            await b.stop()


async def test_sqlite_is_one_process(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}"
    config = CoordinatorConfig(database_url=url, token_key_path=str(tmp_path / "token.key"))
    services = await open_services(config)
    try:
        assert isinstance(services.register_limiter, LocalBuckets)
        assert services.listener is None and services.db_clock is None
    finally:
        await services.close()
    engine = make_engine(url)
    try:
        with pytest.raises(ConfigError):
            await open_services(config, engine=engine, replicas=True)
    finally:
        await engine.dispose()
