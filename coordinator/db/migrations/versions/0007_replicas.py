"""replicas, presence and large signal frames

Revision ID: 0007
Revises: 0006

Coordinator replicas sharing one PostgreSQL (``coordinator.presence``, ``coordinator.relay``): each
replica's heartbeat, which replica holds which peer's signaling socket, and relayed frames too large
for a NOTIFY payload. A single SQLite process creates the tables and never writes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("listening", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_replicas_heartbeat_at", "replicas", ["heartbeat_at"])
    op.create_table(
        "presence",
        sa.Column("peer_id", sa.String(length=40), nullable=False),
        sa.Column("replica_id", sa.String(length=32), nullable=False),
        sa.Column("conn", sa.String(length=32), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["replica_id"], ["replicas.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("peer_id"),
    )
    op.create_index("ix_presence_replica_id", "presence", ["replica_id"])
    op.create_table(
        "signal_frames",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("replica_id", sa.String(length=32), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_signal_frames_replica_id", "signal_frames", ["replica_id"])


def downgrade() -> None:
    op.drop_index("ix_signal_frames_replica_id", table_name="signal_frames")
    op.drop_table("signal_frames")
    op.drop_index("ix_presence_replica_id", table_name="presence")
    op.drop_table("presence")
    op.drop_index("ix_replicas_heartbeat_at", table_name="replicas")
    op.drop_table("replicas")
