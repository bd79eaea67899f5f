"""feed observer: checkpoints, receipts, alarms

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 07:40:00.000000
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
    op.create_table(
        "feed_checkpoints",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("resume_cursor", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("applied_position", sa.BigInteger(), nullable=True),
        sa.Column("closed_through_timestamp", sa.BigInteger(), nullable=True),
        sa.Column("version", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("caught_up_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "kind IN ('cursor', 'timestamp')", name=op.f("ck_feed_checkpoints_kind")
        ),
        sa.CheckConstraint("version >= 1", name=op.f("ck_feed_checkpoints_version")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_feed_checkpoints")),
    )
    op.create_table(
        "feed_receipts",
        sa.Column("feed", sa.String(length=64), nullable=False),
        sa.Column("event_id", sa.String(length=255), nullable=False),
        sa.Column("event_order", sa.BigInteger(), nullable=False),
        sa.Column("operation_id", sa.UUID(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("observation_id", sa.BigInteger(), nullable=True),
        sa.Column("digest", sa.String(length=64), server_default=sa.text("''"), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "state IN ('applied', 'ignored', 'quarantined', 'held')",
            name=op.f("ck_feed_receipts_state"),
        ),
        sa.PrimaryKeyConstraint("feed", "event_id", name=op.f("pk_feed_receipts")),
    )
    op.create_index("ix_feed_receipts_feed_event_order", "feed_receipts", ["feed", "event_order"])
    op.create_index(
        "ix_feed_receipts_held",
        "feed_receipts",
        ["feed"],
        postgresql_where=sa.text("state = 'held'"),
    )
    op.create_table(
        "feed_alarms",
        sa.Column("feed", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("event_id", sa.String(length=255), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("count", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column(
            "first_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column(
            "last_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("feed", "kind", "event_id", name=op.f("pk_feed_alarms")),
    )


def downgrade() -> None:
    op.drop_table("feed_alarms")
    op.drop_index("ix_feed_receipts_held", table_name="feed_receipts")
    op.drop_index("ix_feed_receipts_feed_event_order", table_name="feed_receipts")
    op.drop_table("feed_receipts")
    op.drop_table("feed_checkpoints")
