"""the work list's index holds open operations only

The work list reads only in_progress, unknown and conflict rows, but its index held every
operation: each new operation added an entry when claimed and another when it completed.
Partial now, it is written at the claim only, and stays as small as the open rows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 11:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = sa.text("state IN ('in_progress', 'unknown', 'conflict')")


def upgrade() -> None:
    op.drop_index("ix_operations_tenant_state", table_name="operations")
    op.create_index(
        "ix_operations_open_tenant_state",
        "operations",
        ["tenant", "state", "created_at"],
        unique=False,
        postgresql_where=OPEN,
    )


def downgrade() -> None:
    op.drop_index("ix_operations_open_tenant_state", table_name="operations", postgresql_where=OPEN)
    op.create_index("ix_operations_tenant_state", "operations", ["tenant", "state"], unique=False)
