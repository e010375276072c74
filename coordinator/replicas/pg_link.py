"""Dedicated PostgreSQL connections beside the pool: how a replica reaches its own schema, listens for
NOTIFY, and notices that the server has gone.

The pool's connections come and go per request; what must outlive a request (a LISTEN, a session
advisory lock that IS a replica's leadership) holds a connection of its own, opened with asyncpg
directly from the engine's URL and the schema the engine uses. Channel and lock names carry the
schema, so coordinators (and tests) in different schemas of one database never hear or block each
other. TCP keepalives are asked of the server (``tcp_keepalives_*``) so that a replica whose machine
vanished without closing its socket loses its locks within ~30 s, not the kernel's two hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0
KEEPALIVES = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"}


class Link:
    """Where a dedicated connection goes: the engine's server and database, in its schema."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema

    @classmethod
    async def of(cls, engine: AsyncEngine) -> Link:
        async with engine.connect() as conn:
            schema = str((await conn.execute(text("SELECT current_schema()"))).scalar_one())
        dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        return cls(dsn, schema)

    def name(self, what: str) -> str:
        """A channel name for ``what`` in this schema (an identifier of at most 63 bytes)."""
        digest = hashlib.sha256(self.schema.encode()).hexdigest()[:12]
        return f"lah_{what}_{digest}"

    def lock_key(self, what: str) -> int:
        """A bigint advisory-lock key for ``what`` in this schema."""
        digest = hashlib.sha256(f"lah:{what}:{self.schema}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(
            self.dsn,
            timeout=CONNECT_TIMEOUT_S,
            server_settings={"search_path": self.schema, **KEEPALIVES},
        )


async def ping(conn: asyncpg.Connection, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise unless the server answers on ``conn`` within ``timeout``."""
    await conn.fetchval("SELECT 1", timeout=timeout)


async def close_quietly(conn: asyncpg.Connection | None) -> None:
    if conn is None:
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 2.0)
    if not conn.is_closed():
        conn.terminate()


class Listener:
    """LISTEN on channels for as long as it runs, reconnecting when the server goes away.

    ``handlers`` maps a channel to what is called with each payload. ``on_gap`` is called whenever
    notifications may have been missed (the connection was lost; and once at the first connect):
    whoever caches on the strength of notifications must drop that cache then. ``healthy`` says whether
    it is listening now (``/healthz`` reports it).
    """

    def __init__(
        self,
        link: Link,
        handlers: dict[str, Callable[[str], None]],
        on_gap: Callable[[], None],
        *,
        retry_s: float = 1.0,
        ping_s: float = 5.0,
    ) -> None:
        self.link = link
        self.handlers = handlers
        self.on_gap = on_gap
        self.retry_s = retry_s
        self.ping_s = ping_s
        self.healthy = False
        self.conn: asyncpg.Connection | None = None

    def _deliver(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        handler = self.handlers.get(channel)
        if handler is not None:
            try:
                handler(payload)
            except Exception:
                log.exception("notification handler for %s failed", channel)

    async def run(self) -> None:
        while True:
            try:
                self.conn = await self.link.connect()
                lost = asyncio.Event()
                self.conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                for channel in self.handlers:
                    await self.conn.add_listener(channel, self._deliver)
                self.healthy = True
                self.on_gap()
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), self.ping_s)
                    if not lost.is_set():
                        await ping(self.conn)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("notification listener lost its connection: %s", e)
            finally:
                self.healthy = False
                await close_quietly(self.conn)
                self.conn = None
            self.on_gap()
            await asyncio.sleep(self.retry_s)


class DbClock:
    """``base`` (this replica's clock) corrected by its offset from the database server's clock.

    Replicas decide token expiry, invitation expiry and the like on their own clocks; one whose clock
    is a minute off would refuse fresh tokens or accept stale ones. Each replica measures the offset
    (``sync``: the server's ``clock_timestamp()`` against the midpoint of the round trip) at start and
    every minute after, so they all judge time as the one database does, to within a round trip.
    """

    def __init__(self, base: Callable[[], float]) -> None:
        self.base = base
        self.offset = 0.0

    def __call__(self) -> float:
        return self.base() + self.offset

    async def sync(self, engine: AsyncEngine) -> float:
        async with engine.connect() as conn:
            before = self.base()
            server = float(
                (await conn.execute(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())"))).scalar_one()
            )
            after = self.base()
        self.offset = server - (before + after) / 2.0
        return self.offset
