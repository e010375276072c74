"""Alembic migrations of the coordinator's database (SQLite and PostgreSQL).

The app calls :func:`migrate` at startup (upgrade to head). By hand, from the repository root::

    alembic upgrade head                       # LAH_DATABASE_URL, else the SQLite file in the data dir
    alembic revision --autogenerate -m "..."   # after changing coordinator/db/models.py

Replicas that start at once on one PostgreSQL database must not each run the migrations: ``migrate``
first takes a transaction-level advisory lock (``pg_advisory_xact_lock``, keyed by the schema) in the
transaction alembic then upgrades in (PostgreSQL's DDL is transactional). The second replica waits on
the lock until the first commits, then finds the schema at head and does nothing; a replica killed
mid-migration rolls back and releases the lock with its connection.

Beside this module: ``env.py``, the environment alembic runs (async engines, or the connection
``migrate`` passes in; the models' metadata for autogenerate), ``script.py.mako``, the template of a
new revision, and ``versions/``, the revisions themselves (a package: its docstring says why they are
not listed).

May import: coordinator.db.models, coordinator.db.session
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..session import default_url, make_engine

HERE = Path(__file__).resolve().parent
# One lock per schema; released when the migrating transaction ends, however it ends.
MIGRATION_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended('lah:migrate:' || current_schema(), 0))")


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    # Percent signs in a URL (escaped passwords) would read as ConfigParser interpolation.
    cfg.set_main_option("sqlalchemy.url", (url or default_url()).replace("%", "%%"))
    return cfg


async def migrate(url: str | None = None, *, search_path: str | None = None, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (PostgreSQL: inside ``search_path``'s schema)."""
    cfg = alembic_config(url)
    engine = make_engine(url or default_url(), search_path=search_path)
    try:
        async with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(MIGRATION_LOCK)
            await conn.run_sync(_upgrade, cfg, revision)
    finally:
        await engine.dispose()


async def downgrade(
    url: str | None = None, *, search_path: str | None = None, revision: str = "base"
) -> None:
    cfg = alembic_config(url)
    engine = make_engine(url or default_url(), search_path=search_path)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_downgrade, cfg, revision)
    finally:
        await engine.dispose()


def _upgrade(connection: Connection, cfg: Config, revision: str) -> None:
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def _downgrade(connection: Connection, cfg: Config, revision: str) -> None:
    cfg.attributes["connection"] = connection
    command.downgrade(cfg, revision)
