"""where a feed's audit walk and reconciliation pass read next survives a restart

Both walks read what is behind a feed's checkpoint a page at a time, a page every few
requests. They were kept in the observer's memory, so an observer restarted more often than
a walk takes started it again from the beginning each time and never reached the far end of
a long feed. The next place of each is now kept on the checkpoint's row (no version: it
moves no checkpoint), and every observer of the feed goes on from it. The retention purge
looks for the receipts decided longest ago through an index of their decision time, so a
sweep never reads the young ones.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 08:15:00.000000
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
    op.add_column("feed_checkpoints", sa.Column("walk_cursor", sa.Text(), nullable=True))
    op.add_column("feed_checkpoints", sa.Column("walk_after", sa.BigInteger(), nullable=True))
    op.create_index("ix_feed_receipts_decided_at", "feed_receipts", ["decided_at"])


def downgrade() -> None:
    op.drop_index("ix_feed_receipts_decided_at", table_name="feed_receipts")
    op.drop_column("feed_checkpoints", "walk_after")
    op.drop_column("feed_checkpoints", "walk_cursor")
