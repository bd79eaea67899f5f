"""retention: tombstones keep the final state, purges find expired rows by index

Effect rows (accounts, transfers) keep their operation id after the retention purge deletes
the operation, so their foreign keys to operations go.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 07:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint(op.f("fk_accounts_operation_id_operations"), "accounts", type_="foreignkey")
    op.drop_constraint(
        op.f("fk_transfers_operation_id_operations"), "transfers", type_="foreignkey"
    )
    op.add_column(
        "tombstones",
        sa.Column(
            "final_state",
            sa.String(length=16),
            server_default=sa.text("'completed'"),
            nullable=False,
        ),
    )
    op.create_check_constraint(
        op.f("ck_tombstones_final_state"), "tombstones", "final_state IN ('completed', 'failed')"
    )
    op.create_index(op.f("ix_tombstones_operation_id"), "tombstones", ["operation_id"])
    op.create_index(
        "ix_operations_open_created_at",
        "operations",
        ["created_at"],
        postgresql_where=sa.text("state IN ('in_progress', 'unknown', 'conflict')"),
    )
    op.create_index(
        "ix_operations_purgeable_expires_at",
        "operations",
        ["expires_at"],
        postgresql_where=sa.text("state IN ('completed', 'failed')"),
    )


def downgrade() -> None:
    # Fails once a purge has removed an operation that an account or transfer names.
    op.drop_index("ix_operations_purgeable_expires_at", table_name="operations")
    op.drop_index("ix_operations_open_created_at", table_name="operations")
    op.drop_index(op.f("ix_tombstones_operation_id"), table_name="tombstones")
    op.drop_constraint(op.f("ck_tombstones_final_state"), "tombstones", type_="check")
    op.drop_column("tombstones", "final_state")
    op.create_foreign_key(
        op.f("fk_transfers_operation_id_operations"),
        "transfers",
        "operations",
        ["operation_id"],
        ["id"],
    )
    op.create_foreign_key(
        op.f("fk_accounts_operation_id_operations"),
        "accounts",
        "operations",
        ["operation_id"],
        ["id"],
    )
