"""What the coordinator's handlers share: configuration, database, token authority, accounts, limits.

``open_services(config)`` migrates the database to the newest schema, loads (or creates) the token
signing key and builds the rest; ``close()`` releases the database. The web app keeps the result
under ``SERVICES`` and runs ``housekeeping`` while it serves: every ``HOUSEKEEPING_S`` it forgets
revocations of tokens that have expired anyway and rate-limit buckets that are full again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine.p2p import signaling_protocol as sp

from .accounts import Accounts, NotFound
from .config import ConfigError, CoordinatorConfig
from .db.models import Account, Host
from .db.session import default_url, make_engine, session_factory
from .ledger import in_list
from .ratelimit import ClientAddress, ConnectionLimiter, RateLimiter
from .signaling import OfferGate, PeerRefused
from .tokens import TokenAuthority, TokenError, load_signing_key

logger = logging.getLogger(__name__)
HOUSEKEEPING_S = 600.0


@dataclass
class Services:
    config: CoordinatorConfig
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    tokens: TokenAuthority
    accounts: Accounts
    register_limiter: RateLimiter
    ws_limiter: ConnectionLimiter
    client_address: ClientAddress
    offer_gate: OfferGate
    receipt_limiter: RateLimiter  # per trainer account: receipts (a batch costs at least one)
    owns_engine: bool = True

    async def close(self) -> None:
        if self.owns_engine:
            await self.engine.dispose()

    async def authorize_peer(self, token: str | None, peer_id: str) -> None:
        """The signaling hub's check: a valid token of an enabled account that ``peer_id`` is bound to."""
        if token is None:
            raise PeerRefused(sp.TOKEN_REQUIRED, "this hub admits account holders only: send a token")
        try:
            claims = await self.tokens.verify(token)
        except TokenError as e:
            raise PeerRefused(e.code, str(e)) from e
        if claims.peer is not None and claims.peer != peer_id:
            raise PeerRefused(sp.TOKEN_INVALID, "this token was issued for another host")
        try:
            account = await self.accounts.get(claims.sub)
        except NotFound as e:
            raise PeerRefused(sp.TOKEN_INVALID, "the token's account does not exist") from e
        if account.disabled:
            raise PeerRefused(sp.ACCOUNT_DISABLED, "this account is disabled")
        if await self.accounts.host_owner(peer_id) != claims.sub:
            raise PeerRefused(sp.HOST_NOT_BOUND, f"host {peer_id[:12]} is not bound to this account")

    async def housekeep(self) -> tuple[int, int]:
        """One round: (expired revocations deleted, idle rate-limit buckets forgotten)."""
        revocations = await self.tokens.prune()
        buckets = sum(
            limiter.prune() for limiter in (self.register_limiter, self.receipt_limiter, self.ws_limiter.rate)
        )
        buckets += self.offer_gate.limiter.prune()
        return revocations, buckets

    async def housekeeping(self, _app: web.Application) -> AsyncIterator[None]:
        """aiohttp ``cleanup_ctx``: ``housekeep`` every ``HOUSEKEEPING_S`` while the app runs."""

        async def forever() -> None:
            while True:
                await asyncio.sleep(HOUSEKEEPING_S)
                try:
                    await self.housekeep()
                except Exception:  # the database is away for a moment: next round
                    logger.exception("coordinator housekeeping failed")

        task = asyncio.create_task(forever(), name="coordinator-housekeeping")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def refused_peers(self, peer_ids: list[str]) -> set[str]:
        """Those of ``peer_ids`` the hub must drop now: their account is disabled or gone, or they
        are no longer bound (the hub's periodic sweep; one indexed query for all online peers)."""
        if not peer_ids:
            return set()
        async with self.sessions() as s:
            rows = await s.execute(
                select(Host.peer_id)
                .join(Account, Account.id == Host.account_id)
                .where(in_list(s, Host.peer_id, sorted(peer_ids)), Account.disabled.is_(False))
            )
            fine = {r[0] for r in rows}
        return set(peer_ids) - fine


SERVICES = web.AppKey("services", Services)


async def open_services(
    config: CoordinatorConfig,
    *,
    engine: AsyncEngine | None = None,
    search_path: str | None = None,
    run_migrations: bool = True,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> Services:
    """Build the services. ``engine``: use this database as it is (tests; not disposed by ``close``)."""
    owns_engine = engine is None
    if engine is None:
        url = config.database_url or default_url()
        if run_migrations:
            from .migrations import migrate

            await migrate(url, search_path=search_path)
        engine = make_engine(url, search_path=search_path)
    try:
        client_address = ClientAddress(config.trusted_proxies)
    except ValueError as e:
        raise ConfigError(f"trusted_proxies: {e}") from e
    sessions = session_factory(engine)
    tokens = TokenAuthority(
        load_signing_key(config.token_key_path), sessions, ttl_s=config.token_ttl_s, clock=clock
    )
    return Services(
        config=config,
        engine=engine,
        sessions=sessions,
        tokens=tokens,
        accounts=Accounts(
            sessions, allowlist_mode=config.allowlist_mode, invite_ttl_s=config.invite_ttl_s, clock=clock
        ),
        register_limiter=RateLimiter.per_minute(config.register_per_ip_per_minute, clock=monotonic),
        ws_limiter=ConnectionLimiter(config.max_ws_per_ip, clock=monotonic),
        client_address=client_address,
        offer_gate=OfferGate(config.offers_per_minute / 60.0, config.offer_burst, clock=monotonic),
        receipt_limiter=RateLimiter.per_minute(config.receipts_per_account_per_minute, clock=monotonic),
        owns_engine=owns_engine,
    )
