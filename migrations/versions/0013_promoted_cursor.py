"""a cursor feed's checkpoint remembers the cursor a page was last promoted to

A source that promises ``empty-advance`` may answer an empty page with a new token, and the
observer adopts it as the checkpoint's ``resume_cursor`` (no new version: nothing was
passed). If the source broke its promise, the token skips events, and only the
reconciliation pass can find them; on a feed that also promises ``no-backfill`` the pass
starts from a checkpoint the observer started at or promoted to, never from such a token.
An observer that started (a restart, or another process) at a checkpoint whose cursor was
an adopted token took that token as its start, and its passes started past the skipped
events. The row now keeps the cursor a page was last promoted to (or the feed's start),
which adopting a token leaves alone, and an observer starts its passes from it. A row
written before this revision has none (NULL) and its ``resume_cursor`` stands in, as
before, until its next promotion.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 21:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("feed_checkpoints", sa.Column("promoted_cursor", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("feed_checkpoints", "promoted_cursor")
