"""Database fixtures: every test that takes ``db`` runs on SQLite and on PostgreSQL.

PostgreSQL comes from ``LAH_TEST_POSTGRES_URL`` (``.ci/run`` starts Debian's server and sets it; the
default below matches scripts/services). Each test gets a fresh schema.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.db.session import create_all, make_engine

POSTGRES_URL = os.environ.get("LAH_TEST_POSTGRES_URL", "postgresql+asyncpg://lah:lah@127.0.0.1:5432/lah_test")


@pytest.fixture(params=["sqlite", "postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    if request.param == "sqlite":
        engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'coordinator.sqlite3'}")
        await create_all(engine)
        yield engine
        await engine.dispose()
        return
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    async with admin.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {schema}"))
    await admin.dispose()
    engine = make_engine(POSTGRES_URL, search_path=schema)
    await create_all(engine)
    yield engine
    await engine.dispose()
    admin = make_engine(POSTGRES_URL)
    async with admin.begin() as conn:
        await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    await admin.dispose()
