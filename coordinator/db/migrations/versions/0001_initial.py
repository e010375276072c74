"""initial

Revision ID: 0001
Revises: (none)

The schema of coordinator/db/models.py as first released (matches Base.metadata exactly;
tests/coordinator/test_migrations.py compares them on SQLite and PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "allowlist", sa.Column("name", sa.String(length=64), nullable=False), sa.PrimaryKeyConstraint("name")
    )
    op.create_table(
        "credit_days",
        sa.Column("subject_kind", sa.String(length=8), nullable=False),
        sa.Column("subject_id", sa.String(length=40), nullable=False),
        sa.Column("day", sa.Integer(), nullable=False),
        sa.Column("credit", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("subject_kind", "subject_id", "day"),
    )
    op.create_table(
        "revoked_tokens",
        sa.Column("jti", sa.String(length=32), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("jti"),
    )
    op.create_index(op.f("ix_revoked_tokens_expires_at"), "revoked_tokens", ["expires_at"], unique=False)

    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("credit_total", sa.Float(), nullable=False),
        sa.Column("credit_recent", sa.Float(), nullable=False),
        sa.Column("credit_recent_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_index("ix_teams_credit_recent", "teams", ["credit_recent"], unique=False)
    op.create_index("ix_teams_credit_total", "teams", ["credit_total"], unique=False)

    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("credit_total", sa.Float(), nullable=False),
        sa.Column("credit_recent", sa.Float(), nullable=False),
        sa.Column("credit_recent_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_index("ix_accounts_credit_recent", "accounts", ["credit_recent"], unique=False)
    op.create_index("ix_accounts_credit_total", "accounts", ["credit_total"], unique=False)
    op.create_index(op.f("ix_accounts_team_id"), "accounts", ["team_id"], unique=False)

    op.create_table(
        "hosts",
        sa.Column("peer_id", sa.String(length=40), nullable=False),
        sa.Column("public_key", sa.LargeBinary(length=32), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("bound_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("requests_served", sa.BigInteger(), nullable=False),
        sa.Column("flagged", sa.Boolean(), nullable=False),
        sa.Column("credit_total", sa.Float(), nullable=False),
        sa.Column("credit_recent", sa.Float(), nullable=False),
        sa.Column("credit_recent_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
        ),
        sa.PrimaryKeyConstraint("peer_id"),
    )
    op.create_index(op.f("ix_hosts_account_id"), "hosts", ["account_id"], unique=False)
    op.create_index("ix_hosts_credit_recent", "hosts", ["credit_recent"], unique=False)
    op.create_index("ix_hosts_credit_total", "hosts", ["credit_total"], unique=False)

    op.create_table(
        "assignments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host_peer_id", sa.String(length=40), nullable=False),
        sa.Column("experiment", sa.String(length=64), nullable=False),
        sa.Column("expert_uid", sa.String(length=128), nullable=False),
        sa.Column("assigned_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_peer_id"],
            ["hosts.peer_id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("host_peer_id", "experiment", "expert_uid"),
    )
    op.create_index("ix_assignments_expert", "assignments", ["experiment", "expert_uid"], unique=False)
    op.create_index(op.f("ix_assignments_expires_at"), "assignments", ["expires_at"], unique=False)
    op.create_index(op.f("ix_assignments_host_peer_id"), "assignments", ["host_peer_id"], unique=False)

    op.create_table(
        "receipts",
        sa.Column("receipt_id", sa.String(length=32), nullable=False),
        sa.Column("trainer_peer_id", sa.String(length=40), nullable=False),
        sa.Column("host_peer_id", sa.String(length=40), nullable=False),
        sa.Column("expert_uid", sa.String(length=128), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("backward", sa.Boolean(), nullable=False),
        sa.Column("served_at", sa.Float(), nullable=False),
        sa.Column("credit", sa.Float(), nullable=False),
        sa.Column("withheld", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_peer_id"],
            ["hosts.peer_id"],
        ),
        sa.PrimaryKeyConstraint("receipt_id"),
    )
    op.create_index("ix_receipts_host_time", "receipts", ["host_peer_id", "served_at"], unique=False)

    op.create_table(
        "spot_check_flags",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host_peer_id", sa.String(length=40), nullable=False),
        sa.Column("reporter_peer_id", sa.String(length=40), nullable=False),
        sa.Column("expert_uid", sa.String(length=128), nullable=False),
        sa.Column("period_start", sa.Float(), nullable=False),
        sa.Column("period_end", sa.Float(), nullable=False),
        sa.Column("reason", sa.String(length=256), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_peer_id"],
            ["hosts.peer_id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        op.f("ix_spot_check_flags_host_peer_id"), "spot_check_flags", ["host_peer_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_spot_check_flags_host_peer_id"), table_name="spot_check_flags")

    op.drop_table("spot_check_flags")
    op.drop_index("ix_receipts_host_time", table_name="receipts")

    op.drop_table("receipts")
    op.drop_index(op.f("ix_assignments_host_peer_id"), table_name="assignments")
    op.drop_index(op.f("ix_assignments_expires_at"), table_name="assignments")
    op.drop_index("ix_assignments_expert", table_name="assignments")

    op.drop_table("assignments")
    op.drop_index("ix_hosts_credit_total", table_name="hosts")
    op.drop_index("ix_hosts_credit_recent", table_name="hosts")
    op.drop_index(op.f("ix_hosts_account_id"), table_name="hosts")

    op.drop_table("hosts")
    op.drop_index(op.f("ix_accounts_team_id"), table_name="accounts")
    op.drop_index("ix_accounts_credit_total", table_name="accounts")
    op.drop_index("ix_accounts_credit_recent", table_name="accounts")

    op.drop_table("accounts")
    op.drop_index("ix_teams_credit_total", table_name="teams")
    op.drop_index("ix_teams_credit_recent", table_name="teams")

    op.drop_table("teams")
    op.drop_index(op.f("ix_revoked_tokens_expires_at"), table_name="revoked_tokens")

    op.drop_table("revoked_tokens")
    op.drop_table("credit_days")
    op.drop_table("allowlist")
