"""hardening: invitations, name skeletons (accounts and teams), energy report times, credit grant times

Revision ID: 0003
Revises: 0002

Invitations carry a secret code (allowlist mode); accounts keep the skeleton of their name so that
look-alike names are refused; a host's energy report is bounded by the time since its previous one;
a receipt remembers when its credit was granted, so a spot check takes back exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    from coordinator.accounts.confusables import skeleton  # the same function registration uses

    op.create_table(
        "invites",
        sa.Column("code_hash", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("used_at", sa.Float(), nullable=True),
        sa.Column("used_by", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["used_by"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("code_hash"),
    )
    op.create_index(op.f("ix_invites_name"), "invites", ["name"], unique=False)
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(sa.Column("name_skeleton", sa.String(length=256), nullable=True))
        batch.create_index(batch.f("ix_accounts_name_skeleton"), ["name_skeleton"], unique=False)
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("name_skeleton", sa.String(length=256), nullable=True))
        batch.create_index(batch.f("ix_teams_name_skeleton"), ["name_skeleton"], unique=False)
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("energy_reported_at", sa.Float(), server_default="0", nullable=False))
    with op.batch_alter_table("receipts") as batch:
        batch.add_column(sa.Column("credited_at", sa.Float(), nullable=True))

    # Existing names get their skeletons, so new look-alikes of them are refused too.
    conn = op.get_bind()
    for name in ("accounts", "teams"):
        table = sa.table(
            name,
            sa.column("id", sa.Integer()),
            sa.column("name", sa.String()),
            sa.column("name_skeleton", sa.String()),
        )
        rows = conn.execute(sa.select(table.c.id, table.c.name)).all()
        if rows:
            conn.execute(
                table.update().where(table.c.id == sa.bindparam("k")).values(name_skeleton=sa.bindparam("s")),
                [{"k": row_id, "s": skeleton(text)} for row_id, text in rows],
            )


def downgrade() -> None:
    with op.batch_alter_table("receipts") as batch:
        batch.drop_column("credited_at")
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("energy_reported_at")
    with op.batch_alter_table("teams") as batch:
        batch.drop_index(batch.f("ix_teams_name_skeleton"))
        batch.drop_column("name_skeleton")
    with op.batch_alter_table("accounts") as batch:
        batch.drop_index(batch.f("ix_accounts_name_skeleton"))
        batch.drop_column("name_skeleton")
    op.drop_index(op.f("ix_invites_name"), table_name="invites")
    op.drop_table("invites")
