"""host energy

Revision ID: 0002
Revises: 0001

Each host reports the energy its node estimates it spent on contributed work.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("energy_kwh", sa.Float(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("energy_kwh")
