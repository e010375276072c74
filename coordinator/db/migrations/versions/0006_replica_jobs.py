"""replica jobs: shared rate-limit buckets

Revision ID: 0006
Revises: 0005

Rate limits that must hold across every replica of the coordinator (registrations per address,
receipts per account) keep their token buckets in ``rate_buckets`` on PostgreSQL, refilled on the
database's clock (``coordinator.shared_limits``). SQLite, one process, keeps them in memory; the table
exists there too so that both schemas stay the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rate_buckets",
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("granted", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("scope", "key"),
    )


def downgrade() -> None:
    op.drop_table("rate_buckets")
