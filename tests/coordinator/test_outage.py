"""What counts as "the database is away" (503) and what does not (a bug stays a 500), and /healthz."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.exc import IntegrityError, OperationalError

from coordinator.config import CoordinatorConfig
from coordinator.replicas.outage import HEALTH_CHECKS, is_outage
from coordinator.server.app import start_full


def _wrapped(orig: BaseException) -> OperationalError:
    try:
        try:
            raise orig
        except BaseException as e:
            raise OperationalError("SELECT 1", {}, e) from e
    except OperationalError as outer:
        return outer


def test_lost_connections_are_outages_and_bugs_are_not() -> None:
    assert is_outage(ConnectionRefusedError(111, "refused"))
    assert is_outage(_wrapped(asyncpg.exceptions.AdminShutdownError("terminating connection")))
    assert is_outage(_wrapped(asyncpg.exceptions.CannotConnectNowError("starting up")))
    assert is_outage(_wrapped(asyncpg.exceptions.ConnectionDoesNotExistError("closed mid-operation")))
    assert not is_outage(ValueError("a bug"))
    assert not is_outage(IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not is_outage(_wrapped(asyncpg.exceptions.UndefinedTableError("no such table")))
    assert not is_outage(FileNotFoundError("exports"))


async def test_healthz_reports_every_check(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        port=0,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}",
        token_key_path=str(tmp_path / "token.key"),
        exports_dir=str(tmp_path / "exports"),
    )
    running = await start_full(config)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{running.url}/healthz") as r:
                assert r.status == 200 and await r.json() == {"ok": True, "checks": {"database": True}}

            async def relay_down() -> bool:
                return False

            running.runner.app[HEALTH_CHECKS]["relay"] = relay_down  # how another part joins in
            async with http.get(f"{running.url}/healthz") as r:
                assert r.status == 503
                assert await r.json() == {"ok": False, "checks": {"database": True, "relay": False}}
    finally:
        await running.stop()
