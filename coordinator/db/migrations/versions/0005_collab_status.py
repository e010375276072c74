"""collaboration status and trainers' work

Revision ID: 0005
Revises: 0004

Collaborative trainers report their collaboration's state (``collab_status``, short-lived rows for the
swarm page) and the samples they processed; ``trainer_work`` keeps, per trainer key and experiment, the
samples claimed and the forward samples its receipts prove, whose minimum is the trainer's credit.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "collab_status",
        sa.Column("experiment", sa.String(length=64), nullable=False),
        sa.Column("peer_id", sa.String(length=40), sa.ForeignKey("hosts.peer_id"), nullable=False),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("samples_accumulated", sa.BigInteger(), nullable=False),
        sa.Column("samples_per_s", sa.Float(), nullable=False),
        sa.Column("peers", sa.Integer(), nullable=False),
        sa.Column("last_round_epoch", sa.BigInteger(), nullable=True),
        sa.Column("last_round_s", sa.Float(), nullable=True),
        sa.Column("last_round_outcome", sa.String(length=16), nullable=False),
        sa.Column("reported_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("experiment", "peer_id"),
    )
    op.create_index("ix_collab_status_account_id", "collab_status", ["account_id"])
    op.create_index("ix_collab_status_reported_at", "collab_status", ["reported_at"])
    op.create_table(
        "trainer_work",
        sa.Column("peer_id", sa.String(length=40), sa.ForeignKey("hosts.peer_id"), nullable=False),
        sa.Column("experiment", sa.String(length=64), nullable=False),
        sa.Column("receipt_samples", sa.BigInteger(), nullable=False),
        sa.Column("samples_claimed", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("run_samples", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("peer_id", "experiment"),
    )


def downgrade() -> None:
    op.drop_table("trainer_work")
    op.drop_index("ix_collab_status_reported_at", table_name="collab_status")
    op.drop_index("ix_collab_status_account_id", table_name="collab_status")
    op.drop_table("collab_status")
