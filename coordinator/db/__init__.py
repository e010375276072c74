"""The coordinator's database: SQLAlchemy 2 models, engines for SQLite (default) and PostgreSQL.

Layers: ``models`` (tables) → ``session`` (engine and session factory from a URL) → the services
that use them (``coordinator.accounts.accounts``, ``coordinator.credit.ledger``, ...). Schema changes go
through Alembic (``coordinator/migrations``), for both databases.

May import: nothing
"""
