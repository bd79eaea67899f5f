"""an operator may accept a feed's conflicting identity after review

A page that serves an event at another place, another event at a served place, or a settled
event with other content stops its feed: nothing moves until the page changes. When the
source's new account is right (reviewed), an operator accepts it: the receipts involved are
unpinned (``pinned`` false: their outcome stays, their place and content are no longer held
against the feed). The alarm records where the page served the event (``event_order``), so
the receipt holding that place is unpinned too.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 07:30:00.000000
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
    op.add_column(
        "feed_receipts",
        sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.text("true")),
    )
    op.add_column("feed_alarms", sa.Column("event_order", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("feed_alarms", "event_order")
    op.drop_column("feed_receipts", "pinned")
