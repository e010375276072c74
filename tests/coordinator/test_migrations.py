"""Migrations build exactly the schema of coordinator/db/models.py, on SQLite and on PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from coordinator.config import CoordinatorConfig
from coordinator.db.migrations import downgrade, migrate
from coordinator.db.models import Base
from coordinator.db.session import make_engine
from coordinator.services import open_services
from tests.dbs import POSTGRES_URL


def _diff(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


async def _check(url: str, search_path: str | None = None) -> None:
    await migrate(url, search_path=search_path)
    await migrate(url, search_path=search_path)  # already at head: nothing to do
    engine = make_engine(url, search_path=search_path)
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(_diff) == []
            assert await conn.run_sync(_tables) == set(Base.metadata.tables) | {"alembic_version"}
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
            assert version == "0009"  # the newest revision
        await downgrade(url, search_path=search_path)
        async with engine.connect() as conn:
            assert await conn.run_sync(_tables) == {"alembic_version"}
        await migrate(url, search_path=search_path)
        async with engine.connect() as conn:
            assert await conn.run_sync(_diff) == []
    finally:
        await engine.dispose()


async def test_migrations_match_models_on_sqlite(tmp_path: Path) -> None:
    await _check(f"sqlite+aiosqlite:///{tmp_path / 'fresh.sqlite3'}")


async def test_migrations_match_models_on_postgres() -> None:
    schema = f"m_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    async with admin.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        await _check(POSTGRES_URL, search_path=schema)
    finally:
        async with admin.begin() as conn:
            await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        await admin.dispose()


async def test_open_services_migrates_a_fresh_database(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'app.sqlite3'}", token_key_path=str(tmp_path / "k")
    )
    services = await open_services(config)
    try:
        account = await services.accounts.register("ada")
        claims = await services.tokens.verify(services.tokens.issue(account.id, account.role))
        assert claims.sub == account.id
    finally:
        await services.close()
    services = await open_services(config)  # a restart: migrations are a no-op, data is there
    try:
        assert (await services.accounts.by_name("ada")).id == account.id
    finally:
        await services.close()
