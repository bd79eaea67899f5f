"""a held feed event keeps the event as served, so it can be decided again on its own

A hold (an operation not known yet, evidence that does not verify) is durable but not final.
It was re-examined only when the feed served its event again, and an operator's retry
deleted the hold, its only record. The receipt now keeps the event's evidence and signature
while it is held, so the observer re-decides due holds by itself and an operator's retry
re-decides the stored event. Both columns are cleared when the receipt becomes final.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 04:00:00.000000
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
    op.add_column("feed_receipts", sa.Column("evidence", sa.LargeBinary(), nullable=True))
    op.add_column("feed_receipts", sa.Column("signature", sa.String(256), nullable=True))


def downgrade() -> None:
    op.drop_column("feed_receipts", "signature")
    op.drop_column("feed_receipts", "evidence")
