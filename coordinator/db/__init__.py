"""The coordinator's database: SQLAlchemy 2 models, engines for SQLite (default) and PostgreSQL, and the
Alembic migrations that bring either to the models' schema.

Layers: ``models`` (tables) → ``session`` (engine and session factory from a URL) → ``migrations/``
(a package: Alembic's environment and revisions, and ``migrate``, which :mod:`coordinator.services`
runs at startup) → the services that use them (``coordinator.accounts.accounts``,
``coordinator.credit.ledger``, ...). Schema changes go through a new revision, for both databases.

May import: nothing
"""
