"""Async engines from a database URL: SQLite (aiosqlite) by default, PostgreSQL (asyncpg) in production."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from .models import Base


def default_url() -> str:
    path = Path(platformdirs.user_data_dir("learning-at-home")) / "coordinator.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite+aiosqlite:///{path}"


def make_engine(url: str | None = None, search_path: str | None = None) -> AsyncEngine:
    """``search_path`` (PostgreSQL only) puts the tables in one schema: tests get one each."""
    url = url or default_url()
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            # WAL: readers (pages) never wait for the writer (receipt ingestion); a crash loses
            # nothing that was committed.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # timeout: a connect to a server that is away fails in 5 s (asyncpg's default is 60), and the pool
    # pings a connection before lending it, so none that died with a restarted server is handed out.
    connect_args: dict[str, object] = {"timeout": 5}
    if search_path is not None:
        connect_args["server_settings"] = {"search_path": search_path}
    return create_async_engine(
        url, pool_size=10, max_overflow=20, pool_timeout=10, pool_pre_ping=True, connect_args=connect_args
    )


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


async def create_all(engine: AsyncEngine) -> None:
    """For tests only: production schemas come from Alembic migrations."""
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
