"""What the coordinator's handlers share: configuration, database, token authority, accounts, limits.

``open_services(config)`` migrates the database to the newest schema, loads (or creates) the token
signing key and builds the rest; ``close()`` releases the database. The web app keeps the result
under ``SERVICES`` and runs ``housekeeping`` while it serves: every ``HOUSEKEEPING_S`` it forgets
revocations of tokens that have expired anyway and rate-limit buckets that are full again.

Replicas. On PostgreSQL (opened from the URL, or ``replicas=True``) every coordinator process is one
of N identical replicas, and nothing another replica needs stays in this one's memory: registration
and receipt limits are ``shared_limits.DatabaseBuckets`` (refilled on the database's clock), token
revocations are announced to every replica (``tokens``, through a ``pg_link.Listener``), periodic
work runs on the one replica that holds the leadership lock (``leader.Leader``), and this replica's
clock is corrected to the database's (``pg_link.DbClock``) for token and invitation expiry. What
stays per replica, on purpose: the signaling hub's per-socket limits (see ``shared_limits``) and the
in-memory buckets' own pruning. SQLite is one process and keeps everything as it was: in-memory
buckets, a leader that always leads, its own clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine.p2p import signaling_protocol as sp

from .accounts.accounts import Accounts, NotFound
from .accounts.tokens import TokenAuthority, TokenError, load_signing_key
from .config import ConfigError, CoordinatorConfig
from .credit.ledger import in_list
from .db.models import Account, Host
from .db.session import default_url, make_engine, session_factory
from .http.ratelimit import ClientAddress, ConnectionLimiter, RateLimiter
from .hub.batching import Batcher
from .hub.offer_gate import OfferGate
from .hub.signaling import PeerRefused
from .replicas.leader import Leader, LocalLeader
from .replicas.pg_link import DbClock, Link, Listener
from .replicas.shared_limits import Buckets, DatabaseBuckets, LocalBuckets

logger = logging.getLogger(__name__)
HOUSEKEEPING_S = 600.0
CLOCK_SYNC_S = 60.0


@dataclass
class Services:
    config: CoordinatorConfig
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    tokens: TokenAuthority
    accounts: Accounts
    register_limiter: Buckets  # per client address
    ws_limiter: ConnectionLimiter
    client_address: ClientAddress
    offer_gate: OfferGate
    receipt_limiter: Buckets  # per trainer account: receipts (a batch costs at least one)
    owns_engine: bool = True
    leader: LocalLeader = field(default_factory=LocalLeader)  # runs the periodic jobs
    listener: Listener | None = None  # replicas: hears revocations made on the others
    db_clock: DbClock | None = None  # replicas: this replica's clock, corrected to the database's
    # The hub's admissions look their hosts up in batches: one query per batch, not per hello.
    host_owners: Batcher[str, tuple[int, bool] | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.host_owners = Batcher(self.accounts.host_owners)

    @property
    def replicated(self) -> bool:
        """One of N replicas on PostgreSQL (else one process)."""
        return self.listener is not None

    async def close(self) -> None:
        await self.host_owners.close()
        if self.owns_engine:
            await self.engine.dispose()

    async def authorize_peer(self, token: str | None, peer_id: str) -> None:
        """The signaling hub's check: a valid token of an enabled account that ``peer_id`` is bound to.

        The common case costs no database read of its own: the signature and expiry are checked
        here, revocation against the list in memory (replicas, ``tokens``), and the host's binding
        and account in a batched lookup shared with the other hellos arriving meanwhile. A refusal
        reads the account again to say precisely why."""
        if token is None:
            raise PeerRefused(sp.TOKEN_REQUIRED, "this hub admits account holders only: send a token")
        try:
            claims = await self.tokens.verify(token)
        except TokenError as e:
            raise PeerRefused(e.code, str(e)) from e
        if claims.peer is not None and claims.peer != peer_id:
            raise PeerRefused(sp.TOKEN_INVALID, "this token was issued for another host")
        owner = await self.host_owners.get(peer_id)
        if owner is not None and owner[0] == claims.sub:
            if owner[1]:
                raise PeerRefused(sp.ACCOUNT_DISABLED, "this account is disabled")
            return
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
        revocations, shared = await self.housekeep_shared()
        return revocations, shared + await self.housekeep_local()

    async def housekeep_shared(self) -> tuple[int, int]:
        """The database's part, run by the leading replica: (revocations, shared buckets) pruned."""
        revocations = await self.tokens.prune()
        buckets = 0
        for limiter in (self.register_limiter, self.receipt_limiter):
            if isinstance(limiter, DatabaseBuckets):
                buckets += await limiter.prune()
        return revocations, buckets

    async def housekeep_local(self) -> int:
        """This replica's memory, run by every replica: idle in-memory buckets forgotten."""
        self.tokens.forget_expired()
        buckets = self.ws_limiter.rate.prune() + self.offer_gate.limiter.prune()
        for limiter in (self.register_limiter, self.receipt_limiter):
            if isinstance(limiter, LocalBuckets):
                buckets += await limiter.prune()
        return buckets

    async def housekeeping(self, _app: web.Application) -> AsyncIterator[None]:
        """aiohttp ``cleanup_ctx``: while the app runs, the leader election (and the leader's jobs,
        ``housekeep_shared`` among them), the revocation listener, the clock's sync, and
        ``housekeep_local`` every ``HOUSEKEEPING_S``."""

        async def every(period: float, work: Callable[[], Awaitable[object]], what: str) -> None:
            while True:
                await asyncio.sleep(period)
                try:
                    await work()
                except Exception:  # the database is away for a moment: next round
                    logger.exception("coordinator %s failed", what)

        tasks = [
            asyncio.create_task(every(HOUSEKEEPING_S, self.housekeep_local, "housekeeping")),
            asyncio.create_task(self.leader.run(), name="coordinator-leader"),
        ]
        if self.listener is not None:
            tasks.append(asyncio.create_task(self.listener.run(), name="coordinator-listener"))
        if self.db_clock is not None:
            clock = self.db_clock
            tasks.append(
                asyncio.create_task(every(CLOCK_SYNC_S, lambda: clock.sync(self.engine), "clock sync"))
            )
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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
    replicas: bool | None = None,
) -> Services:
    """Build the services. ``engine``: use this database as it is (tests; not disposed by ``close``).

    ``replicas``: run as one of N replicas sharing the database (PostgreSQL only). None: when the
    database is PostgreSQL and opened here from the URL, i.e. in production; tests that hand in an
    engine and fake clocks keep the one-process behaviour unless they ask.
    """
    owns_engine = engine is None
    if engine is None:
        url = config.database_url or default_url()
        if run_migrations:
            from .db.migrations import migrate

            await migrate(url, search_path=search_path)
        engine = make_engine(url, search_path=search_path)
    postgres = engine.dialect.name == "postgresql"
    if replicas is None:
        replicas = postgres and owns_engine
    if replicas and not postgres:
        raise ConfigError("replicas share a PostgreSQL database; SQLite is for one process")
    try:
        client_address = ClientAddress(config.trusted_proxies)
    except ValueError as e:
        raise ConfigError(f"trusted_proxies: {e}") from e
    sessions = session_factory(engine)
    db_clock: DbClock | None = None
    leader: LocalLeader = LocalLeader()
    listener: Listener | None = None
    register_limiter: Buckets
    receipt_limiter: Buckets
    if replicas:
        db_clock = DbClock(clock)
        await db_clock.sync(engine)
        clock = db_clock
        link = await Link.of(engine)
        leader = Leader(link)
        register_limiter = DatabaseBuckets.per_minute(sessions, "register", config.register_per_ip_per_minute)
        receipt_limiter = DatabaseBuckets.per_minute(
            sessions, "receipts", config.receipts_per_account_per_minute
        )
    else:
        register_limiter = LocalBuckets(
            RateLimiter.per_minute(config.register_per_ip_per_minute, clock=monotonic)
        )
        receipt_limiter = LocalBuckets(
            RateLimiter.per_minute(config.receipts_per_account_per_minute, clock=monotonic)
        )
    tokens = TokenAuthority(
        load_signing_key(config.token_key_path), sessions, ttl_s=config.token_ttl_s, clock=clock
    )
    if replicas:
        channel = link.name("revoked")
        tokens.notify_channel = channel
        listener = Listener(link, {channel: tokens.revoked_elsewhere}, tokens.notifications_missed)
        heard = listener
        tokens.listening = lambda: heard.healthy
    services = Services(
        config=config,
        engine=engine,
        sessions=sessions,
        tokens=tokens,
        accounts=Accounts(
            sessions, allowlist_mode=config.allowlist_mode, invite_ttl_s=config.invite_ttl_s, clock=clock
        ),
        register_limiter=register_limiter,
        ws_limiter=ConnectionLimiter(config.max_ws_per_ip, clock=monotonic),
        client_address=client_address,
        offer_gate=OfferGate(config.offers_per_minute / 60.0, config.offer_burst, clock=monotonic),
        receipt_limiter=receipt_limiter,
        owns_engine=owns_engine,
        leader=leader,
        listener=listener,
        db_clock=db_clock,
    )
    # The database's share of housekeeping: on the leading replica only.
    leader.add_job("housekeeping", HOUSEKEEPING_S, services.housekeep_shared, first_s=HOUSEKEEPING_S)
    return services
