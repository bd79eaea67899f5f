"""operator console sessions, and feed receipts found by their operation

An operator signs in to the console with an admin API key, which is exchanged for a
server-side session: the row is found by the SHA-256 of the random session id (the id itself
is only in the operator's cookie), carries the form token its state-changing forms must send
back, and ends at ``expires_at``. ``key_fingerprint`` is the SHA-256 of the principal's key
hash at sign-in: a rotated or revoked key no longer matches, so its sessions end at once.

The console's operation page lists the feed receipts that touched the operation, found
through a new index on ``feed_receipts.operation_id``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("principal_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("key_fingerprint", sa.LargeBinary(32), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["principal_id"],
            ["principals.id"],
            name="fk_console_sessions_principal_id_principals",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id_hash", name="pk_console_sessions"),
    )
    op.create_index("ix_console_sessions_expires_at", "console_sessions", ["expires_at"])
    op.create_index("ix_feed_receipts_operation_id", "feed_receipts", ["operation_id"])


def downgrade() -> None:
    op.drop_index("ix_feed_receipts_operation_id", table_name="feed_receipts")
    op.drop_index("ix_console_sessions_expires_at", table_name="console_sessions")
    op.drop_table("console_sessions")
