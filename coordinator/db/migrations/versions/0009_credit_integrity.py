"""credit that cannot be minted or wrongly reversed

Revision ID: 0009
Revises: 0008

Assignment history (``assignment_spans``: a receipt is credited only for a host that held the expert
when it served; seeded from today's assignments), credit per host per hour (the caps), refusals
counted per day and reason, what a receipt earned before withholding (an operator's undo), and on
spot-check flags the reporter's account, the report's id (replays), when it came and when it was undone.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "assignment_spans",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("host_peer_id", sa.String(length=40), sa.ForeignKey("hosts.peer_id"), nullable=False),
        sa.Column("expert_uid", sa.String(length=128), nullable=False),
        sa.Column("held_from", sa.Float(), nullable=False),
        sa.Column("held_until", sa.Float(), nullable=False),
        sa.Column("device", sa.String(length=8), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_assignment_spans_host", "assignment_spans", ["host_peer_id", "held_until"])
    op.execute(
        "INSERT INTO assignment_spans"
        " (host_peer_id, expert_uid, held_from, held_until, device, memory_bytes) "
        "SELECT host_peer_id, expert_uid, assigned_at, expires_at, 'cpu', 0 FROM assignments"
    )
    op.create_table(
        "credit_hours",
        sa.Column("host_peer_id", sa.String(length=40), nullable=False),
        sa.Column("trainer_account_id", sa.Integer(), nullable=False),
        sa.Column("hour", sa.Integer(), nullable=False),
        sa.Column("credit", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("host_peer_id", "trainer_account_id", "hour"),
    )
    op.create_table(
        "credit_refusals",
        sa.Column("day", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("day", "kind", "reason"),
    )
    op.add_column("receipts", sa.Column("earned", sa.Float(), nullable=True))
    with op.batch_alter_table("spot_check_flags") as batch:
        batch.add_column(sa.Column("reporter_account_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("report_id", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("reported_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("undone_at", sa.Float(), nullable=True))
    op.create_index("ux_spot_check_flags_report_id", "spot_check_flags", ["report_id"], unique=True)
    op.create_index(
        "ix_spot_check_flags_reporter",
        "spot_check_flags",
        ["reporter_account_id", "host_peer_id", "reported_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_spot_check_flags_reporter", table_name="spot_check_flags")
    op.drop_index("ux_spot_check_flags_report_id", table_name="spot_check_flags")
    with op.batch_alter_table("spot_check_flags") as batch:
        batch.drop_column("undone_at")
        batch.drop_column("reported_at")
        batch.drop_column("report_id")
        batch.drop_column("reporter_account_id")
    op.drop_column("receipts", "earned")
    op.drop_table("credit_refusals")
    op.drop_table("credit_hours")
    op.drop_index("ix_assignment_spans_host", table_name="assignment_spans")
    op.drop_table("assignment_spans")
