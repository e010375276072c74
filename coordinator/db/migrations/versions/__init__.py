"""The schema's revisions, one file per change, oldest first (``0001_initial`` ... the newest).

Alembic finds them by this directory and orders them by their own ``down_revision`` links, so they are
not listed here: ``alembic history`` is the list. A revision describes the schema of its moment and
imports nothing of the live code, but for ``0003_hardening``, which fills the names' skeletons with the
very function registration uses.

May import: coordinator.accounts.confusables
"""
