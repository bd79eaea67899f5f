"""refunds: a refund's row, and how much of each transfer was refunded

``refunds`` holds one row per refund (per operation and reservation epoch, like
``transfers``); ``transfer_refunds`` holds, per refunded transfer, the transfer's amount and
the sum refunded so far, held to it by a CHECK (service.domain.refunds). Both are new tables:
a server still on the previous revision never reads them. Their keys start with the tenant.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 04:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "refunds",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("operation_id", sa.UUID(), nullable=False),
        sa.Column("binding_generation", sa.Integer(), nullable=False),
        sa.Column("transfer_id", sa.UUID(), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("memo", sa.String(length=512), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("amount > 0", name=op.f("ck_refunds_amount_positive")),
        sa.CheckConstraint("currency ~ '^[A-Z]{3}$'", name=op.f("ck_refunds_currency")),
        sa.PrimaryKeyConstraint("tenant", "id", name=op.f("pk_refunds")),
        sa.UniqueConstraint(
            "tenant",
            "operation_id",
            "binding_generation",
            name=op.f("uq_refunds_tenant_operation_id_binding_generation"),
        ),
    )
    op.create_table(
        "transfer_refunds",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("transfer_id", sa.UUID(), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("refunded", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "refunded > 0 AND refunded <= amount",
            name=op.f("ck_transfer_refunds_refunded_within_amount"),
        ),
        sa.PrimaryKeyConstraint("tenant", "transfer_id", name=op.f("pk_transfer_refunds")),
    )


def downgrade() -> None:
    op.drop_table("transfer_refunds")
    op.drop_table("refunds")
