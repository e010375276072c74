"""Shared by the replica tests: N full coordinators on one fresh PostgreSQL schema, and a TCP proxy in
front of PostgreSQL that a test can cut (a real outage of one test's connections only: the server
stays up for everyone else's tests)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.db.session import make_engine
from coordinator.server.app import RunningCoordinator, start_full
from coordinator.services import open_services
from tests.dbs import POSTGRES_URL

EXP = ExperimentConfig(name="mnist", expert_type="ffn", grid=[4, 4], expert_cost=2.0)


@contextlib.asynccontextmanager
async def fresh_schema() -> AsyncIterator[str]:
    """An empty schema in the test database, dropped afterwards."""
    schema = f"r_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    async with admin.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {schema}"))
    await admin.dispose()
    try:
        yield schema
    finally:
        admin = make_engine(POSTGRES_URL)
        async with admin.begin() as conn:
            # The replicas' dedicated connections may linger a moment after they stop.
            await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        await admin.dispose()


def replica_config(tmp_path: Path, url: str = POSTGRES_URL, **overrides: Any) -> CoordinatorConfig:
    return CoordinatorConfig(
        port=0,
        database_url=url,
        token_key_path=str(tmp_path / "token.key"),  # every replica signs with the one key
        exports_dir=str(tmp_path / "exports"),
        verify_workers=0,
        experiments=[EXP],
        **overrides,
    )


async def start_replica(
    tmp_path: Path,
    schema: str,
    *,
    url: str = POSTGRES_URL,
    clock: Callable[[], float] = time.time,
    **overrides: Any,
) -> RunningCoordinator:
    """One full coordinator (migrating the schema if it must), as ``lah coordinator`` runs it."""
    config = replica_config(tmp_path, url, **overrides)
    services = await open_services(config, search_path=schema, clock=clock)
    return await start_full(config, services)


async def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, every: float = 0.05) -> None:
    """Poll ``predicate`` (sync or async) until it is true; TimeoutError after ``timeout``."""
    async with asyncio.timeout(timeout):
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return
            await asyncio.sleep(every)


@dataclass
class PgProxy:
    """A TCP proxy to PostgreSQL on 127.0.0.1: ``cut()`` closes every connection through it and stops
    listening (clients get connection refused), ``restore()`` listens again on the same port."""

    target_host: str
    target_port: int
    port: int = 0
    server: asyncio.Server | None = None

    def __post_init__(self) -> None:
        self.writers: set[asyncio.StreamWriter] = set()

    @classmethod
    async def start(cls, url: str = POSTGRES_URL) -> PgProxy:
        u = make_url(url)
        proxy = cls(u.host or "127.0.0.1", u.port or 5432)
        await proxy.restore()
        return proxy

    def url(self, base: str = POSTGRES_URL) -> str:
        return make_url(base).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self.writers -= {writer, up_writer}

    async def restore(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for w in list(self.writers):
            w.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        await self.cut()
