"""a cursor feed's promotions are kept, so the purge judges a receipt by when it was passed

On a cursor feed whose source promises ``no-backfill``, the retention purge took a final
receipt at or below the applied position once it was decided longer ago than the retention.
The reconciliation pass reads again from the checkpoint promoted to one audit window ago.
A hold can keep the checkpoint behind decided receipts for longer than the retention; when
the checkpoint then jumped over them they were already old enough, the purge took them, and
the next pass, which still read them, found no receipt and raised false ``backfill`` alarms.
Each promotion that moves the applied position now writes a row (the feed, the position,
when), in the statement of the CAS that won it; a receipt goes only once a promotion to its
position or past it is older than the retention, and the rows behind the newest such one go
with the receipts. Each cursor checkpoint's current position is recorded as promoted at its
``updated_at`` (its last promotion), so receipts already passed stay no longer than that.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 21:05:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "feed_promotions",
        sa.Column("feed", sa.String(64), nullable=False),
        sa.Column("applied_position", sa.BigInteger(), nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("feed", "applied_position", name="pk_feed_promotions"),
    )
    op.create_index(
        "ix_feed_promotions_feed_promoted_at", "feed_promotions", ["feed", "promoted_at"]
    )
    op.execute(
        "INSERT INTO feed_promotions (feed, applied_position, promoted_at)"
        " SELECT name, applied_position, updated_at FROM feed_checkpoints"
        " WHERE kind = 'cursor' AND applied_position IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_index("ix_feed_promotions_feed_promoted_at", table_name="feed_promotions")
    op.drop_table("feed_promotions")
