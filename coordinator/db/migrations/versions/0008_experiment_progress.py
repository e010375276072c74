"""experiments' training progress

Revision ID: 0008
Revises: 0007

Trainers report each evaluation of an experiment's model (``coordinator.progress``): the step, the
training tokens, the validation loss, the speed and maybe a generated sample, which the experiment's
page draws as one validation-loss curve per trainer account.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "experiment_progress",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("experiment", sa.String(length=64), nullable=False),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("train_tokens", sa.BigInteger(), nullable=False),
        sa.Column("val_loss", sa.Float(), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=False),
        sa.Column("sample", sa.Text(), nullable=True),
        sa.Column("reported_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_experiment_progress_account_id", "experiment_progress", ["account_id"])
    op.create_index(
        "ix_experiment_progress_curve", "experiment_progress", ["experiment", "account_id", "train_tokens"]
    )


def downgrade() -> None:
    op.drop_index("ix_experiment_progress_curve", table_name="experiment_progress")
    op.drop_index("ix_experiment_progress_account_id", table_name="experiment_progress")
    op.drop_table("experiment_progress")
