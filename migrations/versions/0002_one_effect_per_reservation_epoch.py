"""one effect per reservation epoch

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 14:39:47.514931
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "accounts",
        sa.Column("binding_generation", sa.Integer(), server_default=sa.text("1"), nullable=False),
    )
    op.drop_constraint(op.f("uq_accounts_operation_id"), "accounts", type_="unique")
    op.create_unique_constraint(
        op.f("uq_accounts_operation_id_binding_generation"),
        "accounts",
        ["operation_id", "binding_generation"],
    )
    op.add_column(
        "transfers",
        sa.Column("binding_generation", sa.Integer(), server_default=sa.text("1"), nullable=False),
    )
    op.drop_constraint(op.f("uq_transfers_operation_id"), "transfers", type_="unique")
    op.create_unique_constraint(
        op.f("uq_transfers_operation_id_binding_generation"),
        "transfers",
        ["operation_id", "binding_generation"],
    )


def downgrade() -> None:
    # Fails if a forced supersede already ran an effect twice: that history cannot fit the
    # older one-per-operation constraint.
    op.drop_constraint(
        op.f("uq_transfers_operation_id_binding_generation"), "transfers", type_="unique"
    )
    op.create_unique_constraint(op.f("uq_transfers_operation_id"), "transfers", ["operation_id"])
    op.drop_column("transfers", "binding_generation")
    op.drop_constraint(
        op.f("uq_accounts_operation_id_binding_generation"), "accounts", type_="unique"
    )
    op.create_unique_constraint(op.f("uq_accounts_operation_id"), "accounts", ["operation_id"])
    op.drop_column("accounts", "binding_generation")
