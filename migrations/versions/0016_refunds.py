"""refunds: a refund's row, and how much of each transfer was refunded

``refunds`` holds one row per refund (per operation and reservation epoch, like
``transfers``; its keys start with the tenant). ``transfers.refunded`` is the sum refunded of
each transfer, held to its amount by a CHECK (service.domain.refunds). A server still on the
previous revision keeps working: it never reads the new table, and its inserts into
``transfers`` leave ``refunded`` at its default, 0. The column's default is a constant, so
adding it rewrites nothing; its CHECK is added NOT VALID (no scan under the table's lock),
then validated, which scans without blocking writes.

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
    op.add_column(
        "transfers",
        sa.Column("refunded", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    check = op.f("ck_transfers_refunded_within_amount")
    op.execute(
        f"ALTER TABLE transfers ADD CONSTRAINT {check} "
        "CHECK (refunded >= 0 AND refunded <= amount) NOT VALID"
    )
    # validated in a transaction of its own: the scan takes no lock that blocks writes
    with op.get_context().autocommit_block():
        op.execute(f"ALTER TABLE transfers VALIDATE CONSTRAINT {check}")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_transfers_refunded_within_amount"), "transfers", type_="check")
    op.drop_column("transfers", "refunded")
    op.drop_table("refunds")
