"""site search and ranges

Revision ID: 0004
Revises: 0003

The site's prefix search reads indexes on lower(name) (text_pattern_ops on PostgreSQL, so LIKE 'x%'
uses them under any collation); its range leaderboards read ``credit_ranges`` (the generation
``credit_range_runs`` publishes), refreshed from ``credit_days`` through an index that holds what a
refresh sums. Enabled accounts are counted by credit through ``ix_accounts_listed`` (no table reads).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    ops = " text_pattern_ops" if pg else ""
    op.execute(f"CREATE INDEX ix_accounts_name_lower ON accounts (lower(name){ops})")
    op.execute(f"CREATE INDEX ix_teams_name_lower ON teams (lower(name){ops})")
    op.create_index("ix_accounts_listed", "accounts", ["disabled", "credit_total"])
    op.create_index("ix_credit_days_day", "credit_days", ["day", "subject_kind", "subject_id", "credit"])
    op.create_table(
        "credit_ranges",
        sa.Column("subject_kind", sa.String(length=8), nullable=False),
        sa.Column("days", sa.Integer(), nullable=False),
        sa.Column("computed_at", sa.Float(), nullable=False),
        sa.Column("subject_id", sa.String(length=40), nullable=False),
        sa.Column("credit", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("subject_kind", "days", "computed_at", "subject_id"),
    )
    op.create_index(
        "ix_credit_ranges_rank",
        "credit_ranges",
        ["subject_kind", "days", "computed_at", "credit", "subject_id"],
    )
    op.create_table(
        "credit_range_runs",
        sa.Column("days", sa.Integer(), nullable=False),
        sa.Column("computed_at", sa.Float(), nullable=False),
        sa.Column("accounts", sa.Integer(), nullable=False),
        sa.Column("teams", sa.Integer(), nullable=False),
        sa.Column("hosts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("days"),
    )


def downgrade() -> None:
    op.drop_table("credit_range_runs")
    op.drop_index("ix_credit_ranges_rank", table_name="credit_ranges")
    op.drop_table("credit_ranges")
    op.drop_index("ix_credit_days_day", table_name="credit_days")
    op.drop_index("ix_teams_name_lower", table_name="teams")
    op.drop_index("ix_accounts_name_lower", table_name="accounts")
    op.drop_index("ix_accounts_listed", table_name="accounts")
